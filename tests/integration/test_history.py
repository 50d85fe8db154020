"""The per-runtime history (migration 0015, store/history.py, docs/guides/history.md):
every transition counted exactly once, in the bucket it happened in, by the statements
that make it, one statement of every kind of move over two runtimes too; the claim
wait's percentiles from known waits; statements of concurrent connections counted
exactly; the janitor's fold, depth and retention in batches; and
GET /v1/history answering a limited token from the runtimes it covers alone.

Buckets are 2 s wide here. A test that needs two buckets waits for a boundary of the
database's clock and checks which side of it each point fell on, so a slow machine
stretches a phase into more buckets but never moves a count across the boundary.
Each test has a freshly migrated database of its own (`own_database_url`).
"""

from __future__ import annotations

import asyncio
import bisect
from datetime import datetime
from typing import Any

import pytest

from gateway.store.history import WAIT_BOUNDS_SECONDS
from tests.support.credentials import make_token
from tests.support.databases import execute, fetch
from tests.support.gateways import Instance, running_gateway
from tests.support.http import req
from tests.support.janitor import first_pass_done, janitor_settings, next_history_bucket
from tests.support.lifecycle import lease_op

pytestmark = pytest.mark.integration

INTERVAL = 2
COUNTS = ("enqueued", "claimed", "completed", "failed", "dead", "expired", "cancelled")


def settings(url: str, redis_url: str, prefix: str, **overrides: Any) -> Any:
    return janitor_settings(url, redis_url, prefix, history_interval_seconds=INTERVAL, **overrides)


async def next_bucket(url: str) -> Any:
    return await next_history_bucket(url, INTERVAL)


def total(points: list[dict[str, Any]]) -> dict[str, int]:
    return {c: sum(p[c] for p in points) for c in COUNTS}


async def history(gw: Instance, runtime: str, token: str | None = None) -> dict[str, Any]:
    kw = {} if token is None else {"auth": token}
    resp = await req(gw, "GET", f"/v1/runtimes/{runtime}/history?window=1h", **kw)
    assert resp.status == 200, resp.body
    body: dict[str, Any] = resp.body
    return body


async def test_every_transition_counts_once_in_its_bucket(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url, rt = own_database_url, runtime_id
    async with running_gateway(settings(url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        janitor = gw.gateway.janitor
        await next_bucket(url)
        # First phase: every kind of transition once or more.
        ok = [await gw.enqueue(rt, {"n": i}) for i in range(3)]
        retried = [await gw.enqueue(rt, {"retry": i}, max_attempts=2) for i in range(2)]
        doomed = await gw.enqueue(rt, {"die": 1}, max_attempts=1)
        lapsing = await gw.enqueue(rt, {"lapse": 1})
        expiring = await gw.enqueue(rt, {"expire": 1}, ttl_seconds=3600)
        cancelled = await gw.enqueue(rt, {"cancel": 1})
        assert (await req(gw, "POST", f"/v1/tasks/{cancelled['id']}/cancel", {})).status == 200
        await execute(
            url, "UPDATE tasks SET expires_at = now() WHERE id = $1::uuid", expiring["id"]
        )
        claimed = {t["id"]: t for t in await gw.claim(rt, max_tasks=10, wait_seconds=0)}
        assert len(claimed) == 7
        for task in ok:
            assert (await gw.complete(claimed[task["id"]]))[0] == 200
        for task in retried:
            resp = await lease_op(
                gw, "fail", claimed[task["id"]], error="boom", retry_after_seconds=0
            )
            assert resp.status == 200, resp.body
        resp = await lease_op(gw, "fail", claimed[doomed["id"]], error="boom")
        assert resp.body["status"] == "dead"
        await execute(
            url,
            "UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            lapsing["id"],
        )
        report = await janitor.run_once()  # expiry and lease reclaim
        assert (report.expired, report.reclaimed) == (1, 1), report

        # Second phase, in a later bucket: the three re-queued tasks claimed and buried.
        boundary = await next_bucket(url)
        report = await janitor.run_once()  # the first phase's last bucket has ended
        again = await gw.claim(rt, max_tasks=10, wait_seconds=0)
        assert len(again) == 3
        for task in again:
            assert (await lease_op(gw, "fail", task, error="boom", retry=False)).status == 200

        body = await history(gw, rt)
        assert body["interval_seconds"] == INTERVAL and body["window"] == "1h"
        points = body["points"]
        assert [p["at"] for p in points] == sorted(p["at"] for p in points)
        first = [p for p in points if datetime.fromisoformat(p["at"]) < boundary]
        second = [p for p in points if datetime.fromisoformat(p["at"]) >= boundary]
        assert total(first) == {
            "enqueued": 9,
            "claimed": 7,
            "completed": 3,
            "failed": 3,  # two retried failures and a lapsed lease
            "dead": 1,
            "expired": 1,
            "cancelled": 1,
        }, first
        assert total(second) == {**dict.fromkeys(COUNTS, 0), "claimed": 3, "dead": 3}, second
        # The first phase's last bucket was read once it ended: the three re-queued tasks.
        assert first[-1]["depth"] == 3, first
        # Only first claims have a wait: the retried claims of the second phase have none.
        assert all(p["claim_wait_p50_seconds"] is None for p in second), second
        assert second[-1]["depth"] is None  # still in progress, or not read yet

        # Once the second phase's bucket has ended, the janitor folds it and reads it.
        await next_bucket(url)
        report = await janitor.run_once()
        assert report.errors == [], report
        assert report.history_depths >= 1, report
        after = (await history(gw, rt))["points"]
        assert total(after) == {c: total(first)[c] + total(second)[c] for c in COUNTS}
        assert after[-1]["depth"] == 0, after
        unfolded = await fetch(url, "SELECT count(*) AS n FROM task_history WHERE backend <> 0")
        assert unfolded[0]["n"] == 0


async def test_claim_wait_percentiles_from_known_waits(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url, rt = own_database_url, runtime_id
    async with running_gateway(settings(url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        tasks = [await gw.enqueue(rt, {"n": i}) for i in range(20)]
        ids = [t["id"] for t in tasks]
        # Waits of 3 s (ten), 20 s (nine) and 100 s (one), far inside their buckets; one
        # of the 3 s tasks was created long before it was due, and waits from run_at.
        for seconds, chosen in ((3, ids[:10]), (20, ids[10:19]), (100, ids[19:])):
            await execute(
                url,
                "UPDATE tasks SET created_at = created_at - make_interval(secs => $2),"
                " run_at = run_at - make_interval(secs => $2) WHERE id = ANY($1::uuid[])",
                chosen,
                seconds,
            )
        await execute(
            url,
            "UPDATE tasks SET created_at = created_at - interval '1000 seconds'"
            " WHERE id = $1::uuid",
            ids[0],
        )
        assert len(await gw.claim(rt, max_tasks=20, wait_seconds=0)) == 20
        points = (await history(gw, rt))["points"]
        claimed = [p for p in points if p["claimed"]]
        assert sum(p["claimed"] for p in claimed) == 20
        if len(claimed) == 1:  # the claim's one statement: one bucket
            [point] = claimed
            # The 10th of 20 waits is a 3 s one ([2, 5) s), the 19th a 20 s one ([10, 30) s).
            assert point["claim_wait_p50_seconds"] == 5.0, point
            assert point["claim_wait_p95_seconds"] == 30.0, point
        rows = await fetch(url, "SELECT waits FROM task_history")
        summed = [sum(column) for column in zip(*(r["waits"] for r in rows), strict=True)]
        bounds = [0.0, *WAIT_BOUNDS_SECONDS]
        found = {bounds[i]: n for i, n in enumerate(summed) if n}
        assert found == {2.0: 10, 10.0: 9, 60.0: 1}, found


async def test_the_migration_and_the_store_agree_on_the_wait_buckets(
    own_database_url: str,
) -> None:
    probes = [b - 0.001 for b in WAIT_BOUNDS_SECONDS] + [b for b in WAIT_BOUNDS_SECONDS]
    rows = await fetch(
        own_database_url,
        "SELECT s, history_wait_bucket(s) AS b FROM unnest($1::float8[]) AS s",
        probes,
    )
    for row in rows:
        index = sum(1 for b in WAIT_BOUNDS_SECONDS if b <= row["s"])
        assert row["b"] == index + 1, dict(row)


async def test_concurrent_statements_of_several_connections_are_counted_exactly(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url, rt = own_database_url, runtime_id
    async with running_gateway(settings(url, redis_url, redis_prefix, db_pool_min=8)) as gw:
        await first_pass_done(gw)

        # 8 concurrent clients of 15 enqueues each, then 8 concurrent workers.
        async def producer(c: int) -> None:
            for n in range(15):
                await gw.enqueue(rt, {"c": c, "n": n})

        await asyncio.gather(*(producer(c) for c in range(8)))

        async def worker(name: str) -> int:
            done = 0
            while tasks := await gw.claim(rt, name, max_tasks=3, wait_seconds=0):
                for task in tasks:
                    assert (await gw.complete(task))[0] == 200
                    done += 1
            return done

        assert sum(await asyncio.gather(*(worker(f"w{i}") for i in range(8)))) == 120
        backends = await fetch(url, "SELECT count(DISTINCT backend) AS n FROM task_history")
        assert backends[0]["n"] > 1, "the statements ran on one connection only"
        counted = total((await history(gw, rt))["points"])
        assert counted == {
            **dict.fromkeys(COUNTS, 0),
            "enqueued": 120,
            "claimed": 120,
            "completed": 120,
        }, counted
        await next_bucket(url)
        await gw.gateway.janitor.run_once()
        assert total((await history(gw, rt))["points"]) == counted  # the fold loses nothing


async def test_retention_deletes_old_buckets_in_batches(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url, rt = own_database_url, runtime_id
    async with running_gateway(
        settings(url, redis_url, redis_prefix, history_days=2, janitor_batch_size=10)
    ) as gw:
        await first_pass_done(gw)
        await execute(
            url,
            "INSERT INTO task_history (runtime_id, at, backend, enqueued, waits)"
            " SELECT $1, now() - make_interval(days => 3, secs => n * 60), 0, 1,"
            "        '{0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::bigint[]"
            "   FROM generate_series(1, 120) AS n"
            " UNION ALL"
            " SELECT $1, now() - make_interval(days => 1, secs => n * 60), 0, 1,"
            "        '{0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::bigint[]"
            "   FROM generate_series(1, 5) AS n",
            rt,
        )
        # Ten batches of ten a pass at most: the rest waits for the next pass.
        assert (await gw.gateway.janitor.run_once()).history_purged == 100
        assert (await gw.gateway.janitor.run_once()).history_purged == 20
        assert (await gw.gateway.janitor.run_once()).history_purged == 0
        left = await fetch(url, "SELECT count(*) AS n FROM task_history WHERE runtime_id = $1", rt)
        assert left[0]["n"] == 5


async def test_a_limited_token_learns_nothing_of_other_runtimes(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url = own_database_url
    mine, foreign = f"{runtime_id}-mine", f"{runtime_id}-foreign-secret"
    async with running_gateway(settings(url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        # Both runtimes' activity in one bucket, whose depths the pass below reads once
        # it has ended: a bucket that ends before the last one keeps a null depth.
        await next_bucket(url)
        for rt, queued, failing in ((mine, 2, 1), (foreign, 9, 5)):
            for n in range(queued + failing):
                await gw.enqueue(rt, {"n": n}, max_attempts=1)
            for task in await gw.claim(rt, max_tasks=failing, wait_seconds=0):
                assert (await lease_op(gw, "fail", task, error="boom")).status == 200
        await next_bucket(url)
        await gw.gateway.janitor.run_once()  # the depths of the bucket that ended
        token = (await make_token(gw, ["read"], [mine]))["token"]

        resp = await req(gw, "GET", "/v1/history?window=24h", auth=token)
        assert resp.status == 200, resp.body
        assert foreign not in str(resp.body) and "foreign" not in str(resp.body)
        assert resp.body["top_by_depth"] == [{"runtime_id": mine, "depth": 2}]
        assert resp.body["top_by_failures"] == [{"runtime_id": mine, "failed": 0, "dead": 1}]
        assert total(resp.body["points"])["enqueued"] == 3

        # The admin sees both, the foreign runtime first on both lists.
        every = (await req(gw, "GET", "/v1/history?window=24h")).body
        assert [r["runtime_id"] for r in every["top_by_depth"]] == [foreign, mine]
        assert [r["runtime_id"] for r in every["top_by_failures"]] == [foreign, mine]
        assert total(every["points"])["enqueued"] == 17

        # The foreign runtime's own history is refused to the limited token.
        resp = await req(gw, "GET", f"/v1/runtimes/{foreign}/history", auth=token)
        assert resp.status == 403

        # The listing's sparklines: one per runtime, from the same depths.
        page = (await req(gw, "GET", "/v1/runtimes?include=sparkline")).body["runtimes"]
        lines = {r["runtime_id"]: [p["depth"] for p in r["sparkline"]] for r in page}
        assert lines == {mine: [2], foreign: [9]}, lines
        plain = (await req(gw, "GET", "/v1/runtimes")).body["runtimes"]
        assert all("sparkline" not in r for r in plain)


async def test_an_unknown_window_is_refused_naming_it(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(settings(own_database_url, redis_url, redis_prefix)) as gw:
        for path in (f"/v1/runtimes/{runtime_id}/history?window=2h", "/v1/history?window="):
            resp = await req(gw, "GET", path)
            assert resp.status == 422, resp.body
            assert "window" in str(resp.body), resp.body
        resp = await req(gw, "GET", "/v1/runtimes?include=everything")
        assert resp.status == 422 and "include" in str(resp.body), resp.body


# One statement's moves, for the test below: (runtime, status before, status after,
# attempts before, attempts after, seconds the task had waited when claimed).
MIXED_MOVES = [
    ("a", "queued", "claimed", 0, 1, 0.3),  # first claims: counted with their wait
    ("a", "queued", "claimed", 0, 1, 45.0),
    ("a", "queued", "claimed", 0, 1, 45.0),
    ("a", "queued", "claimed", 1, 2, 3.0),  # a claim again: no wait
    ("a", "claimed", "completed", 1, 1, None),
    ("a", "claimed", "queued", 1, 1, None),  # failed, to be retried
    ("a", "claimed", "queued", 1, 0, None),  # given back undelivered: not a failure
    ("a", "completed", "queued", 1, 1, None),  # a finished task queued again
    ("a", "claimed", "dead", 1, 1, None),
    ("a", "queued", "expired", 0, 0, None),
    ("a", "queued", "cancelled", 0, 0, None),
    ("a", "scheduled", "queued", 0, 0, None),  # a promotion: nothing
    ("a", "claimed", "claimed", 1, 1, None),  # a heartbeat: nothing
    ("b", "queued", "claimed", 0, 1, 3.0),
    ("b", "queued", "claimed", 0, 1, 3.0),
    ("b", "claimed", "completed", 1, 1, None),
    ("b", "queued", "cancelled", 0, 0, None),
]


def expected_moves(runtime: str) -> tuple[dict[str, int], list[int]]:
    """The counts and claim waits MIXED_MOVES make for `runtime`, by the rules of
    docs/guides/history.md."""
    counts = dict.fromkeys(COUNTS, 0)
    waits = [0] * (len(WAIT_BOUNDS_SECONDS) + 1)
    finished = ("completed", "dead", "expired", "cancelled")
    for rt, old, new, tries_before, tries_after, wait in MIXED_MOVES:
        if rt != runtime or old == new or {old, new} <= {"queued", "scheduled"}:
            continue
        if new == "claimed":
            counts["claimed"] += 1
            if tries_after == 1:
                waits[bisect.bisect_right(WAIT_BOUNDS_SECONDS, wait)] += 1
        elif new in finished:
            counts[new] += 1
        elif old in finished:
            counts["enqueued"] += 1
        elif old == "claimed" and tries_after >= tries_before:
            counts["failed"] += 1
    return counts, waits


async def test_one_statement_of_every_kind_of_move_over_two_runtimes_counts_each_once(
    own_database_url: str, runtime_id: str
) -> None:
    """One UPDATE that moves tasks of every kind at once, over two runtimes, as the
    janitor's batches and grouped statements may: each runtime gets the counts and the
    claim waits of its own tasks (the trigger groups a statement's moved tasks by kind
    before it counts them, migration 0018)."""
    url = own_database_url
    runtimes = {"a": f"{runtime_id}-a", "b": f"{runtime_id}-b"}
    rows = await fetch(
        url,
        """INSERT INTO tasks (runtime_id, status, payload, attempts, created_at, run_at,
                              lease_id, lease_expires_at)
           SELECT m.runtime_id, m.status, '{}', m.attempts, now() - interval '1 hour',
                  now() - interval '1 hour',
                  CASE WHEN m.status = 'claimed' THEN time_ordered_uuid() END,
                  CASE WHEN m.status = 'claimed' THEN now() + interval '1 hour' END
             FROM unnest($1::text[], $2::text[], $3::int[]) WITH ORDINALITY
                  AS m(runtime_id, status, attempts, ord)
            ORDER BY m.ord
           RETURNING id""",
        [runtimes[rt] for rt, *_ in MIXED_MOVES],
        [old for _rt, old, *_ in MIXED_MOVES],
        [tries for _rt, _old, _new, tries, *_ in MIXED_MOVES],
    )
    ids = [r["id"] for r in rows]

    async def by_runtime() -> dict[str, tuple[dict[str, int], list[int]]]:
        """Each runtime's counts and claim waits, summed over its history rows."""
        out: dict[str, tuple[dict[str, int], list[int]]] = {
            rt: (dict.fromkeys(COUNTS, 0), [0] * (len(WAIT_BOUNDS_SECONDS) + 1))
            for rt in runtimes.values()
        }
        for r in await fetch(url, "SELECT * FROM task_history"):
            counts, waits = out[r["runtime_id"]]
            for c in COUNTS:
                counts[c] += r[c]
            for i, n in enumerate(r["waits"]):
                waits[i] += n
        return out

    before = await by_runtime()
    await execute(
        url,
        """UPDATE tasks t
              SET status = m.status, attempts = m.attempts,
                  -- A claim's wait is exact, whatever the time the test took to get here.
                  updated_at = CASE WHEN m.wait IS NULL THEN clock_timestamp()
                                    ELSE t.created_at + make_interval(secs => m.wait) END,
                  lease_id = CASE WHEN m.status = 'claimed' THEN time_ordered_uuid() END,
                  lease_expires_at = CASE WHEN m.status = 'claimed'
                                          THEN now() + interval '1 hour' END,
                  finished_at = CASE WHEN m.status IN ('completed', 'dead', 'expired',
                                                       'cancelled') THEN now() END
             FROM unnest($1::uuid[], $2::text[], $3::int[], $4::float8[])
                  AS m(id, status, attempts, wait)
            WHERE t.id = m.id""",
        ids,
        [new for _rt, _old, new, *_ in MIXED_MOVES],
        [after for *_, after, _wait in MIXED_MOVES],
        [wait for *_, wait in MIXED_MOVES],
    )
    after = await by_runtime()
    for key, runtime in runtimes.items():
        counts, waits = expected_moves(key)
        old_counts, old_waits = before[runtime]
        new_counts, new_waits = after[runtime]
        assert {c: new_counts[c] - old_counts[c] for c in COUNTS} == counts, key
        assert [n - o for n, o in zip(new_waits, old_waits, strict=True)] == waits, key
