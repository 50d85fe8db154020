"""Batch lease operations end to end (`POST /v1/tasks:complete`, `:fail`, `:heartbeat`)
against real Postgres and Redis: per-item outcomes in request order, each the single
operation's; lost leases; concurrent batches; isolation; the 1,000-item bound; and the
wake-up a failed task's return to the queue sends.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson
import pytest

from gateway.auth.principals import glob_match
from gateway.store.sql import acks as ack_sql
from tests.support.credentials import make_token, unique
from tests.support.databases import rows
from tests.support.http import Resp, get_task, req
from tests.support.lifecycle import (
    RANDOM_LEASE,
    TIME_RE,
    UNKNOWN_TASK,
    assert_problem,
    claim,
    claim_one,
    enqueue,
    lease_op,
)
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]


def item(task: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"id": task["id"], "lease_id": task["lease_id"], **fields}


async def batch(gw, op: str, items: list[dict[str, Any]], auth: str | None = None) -> Resp:
    kwargs = {} if auth is None else {"auth": auth}
    body = orjson.dumps({"tasks": items})  # as bytes: req streams a large one
    return await req(gw, "POST", f"/v1/tasks:{op}", raw=body, **kwargs)


async def results(gw, op: str, items: list[dict[str, Any]], auth: str | None = None) -> list[Any]:
    resp = await batch(gw, op, items, auth)
    assert resp.status == 200, (resp.status, resp.body)
    assert resp.content_type == "application/json"
    assert [r["id"] for r in resp.body["results"]] == [i["id"] for i in items]
    return list(resp.body["results"])


async def claimed(gw, rt: str, n: int, **fields: Any) -> list[dict[str, Any]]:
    """n tasks of runtime rt, enqueued and claimed (in enqueue order)."""
    resp = await req(
        gw, "POST", f"/v1/runtimes/{rt}/tasks:batch", {"tasks": [{"payload": i} for i in range(n)]}
    )
    assert resp.status == 201, resp.body
    out: list[dict[str, Any]] = []
    while len(out) < n:
        got = await claim(gw, rt, max_tasks=min(100, n - len(out)), **fields)
        assert got, "fewer tasks claimable than enqueued"
        out += got
    return out


def problem_of(entry: dict[str, Any], code: str, status: int) -> dict[str, Any]:
    problem = entry["problem"]
    assert entry["outcome"] == code, entry
    assert problem["code"] == code and problem["status"] == status, entry
    assert problem["title"] and problem["detail"] and problem["type"] == "about:blank", entry
    return dict(problem)


# -- outcomes, in order ----------------------------------------------------------------


async def test_complete_answers_each_item_in_order_as_the_single_complete(gw, runtime_id):
    done, cancelled, stolen, fine = await claimed(gw, runtime_id, 4)
    # A finished task repeated with its own lease, a cancel requested while held, and
    # a lease another claim replaced.
    assert (await lease_op(gw, "complete", done, result=1)).status == 200
    assert (await req(gw, "POST", f"/v1/tasks/{cancelled['id']}/cancel")).status == 200
    items = [
        item(fine, result={"n": [1, "two", None]}),
        {"id": UNKNOWN_TASK, "lease_id": RANDOM_LEASE},
        item(stolen, lease_id=RANDOM_LEASE),
        item(done, result=1),
        item(cancelled),
    ]
    got = await results(gw, "complete", items)
    assert [r["outcome"] for r in got] == [
        "completed", "not_found", "lease_lost", "completed", "cancelled",
    ]  # fmt: skip
    assert set(got[0]) == {"id", "outcome"}
    # The problems are the single endpoint's own, for the same request.
    single = await lease_op(gw, "complete", stolen, lease_id=RANDOM_LEASE)
    assert problem_of(got[2], "lease_lost", 409) == assert_problem(single, 409, "lease_lost")
    single = await req(gw, "POST", f"/v1/tasks/{UNKNOWN_TASK}/complete", {"lease_id": RANDOM_LEASE})
    assert problem_of(got[1], "not_found", 404) == assert_problem(single, 404, "not_found")
    assert got[2]["problem"]["task_status"] == "claimed"
    # What was stored: exactly the successes, each as a single complete stores it.
    finished = await get_task(gw, fine["id"])
    assert finished["status"] == "completed"
    assert finished["result"] == {"n": [1, "two", None]}
    assert (await get_task(gw, stolen["id"]))["status"] == "claimed"
    assert (await get_task(gw, cancelled["id"]))["status"] == "cancelled"


async def test_fail_answers_queued_dead_or_cancelled_as_the_single_fail(gw, runtime_id):
    retry, final, cancelled = await claimed(gw, runtime_id, 3)
    await enqueue(gw, runtime_id, "once", max_attempts=1)
    last = await claim_one(gw, runtime_id)
    await req(gw, "POST", f"/v1/tasks/{cancelled['id']}/cancel")
    items = [
        item(retry, error="try later", retry_after_seconds=120),
        item(final, error="hopeless", retry=False),
        item(cancelled, error="stopped"),
        item(last, error="out of attempts"),
        item(retry, error="again") | {"id": UNKNOWN_TASK},
    ]
    got = await results(gw, "fail", items)
    assert [r["outcome"] for r in got] == ["queued", "dead", "cancelled", "dead", "not_found"]
    stored = await get_task(gw, retry["id"])
    assert stored["status"] == "queued" and stored["last_error"] == "try later"
    assert got[0]["run_at"] == stored["run_at"] and TIME_RE.match(got[0]["run_at"])
    assert stored["run_at"] > stored["updated_at"]  # 120 s later
    assert (await get_task(gw, final["id"]))["last_error"] == "hopeless"
    # A fail is not idempotent: repeating it is lease_lost, as for the single fail.
    again = await results(gw, "fail", [item(final, error="hopeless", retry=False)])
    single = await lease_op(gw, "fail", final, error="hopeless", retry=False)
    assert problem_of(again[0], "lease_lost", 409) == assert_problem(single, 409, "lease_lost")


async def test_heartbeat_extends_each_lease_by_its_own_length(gw, runtime_id):
    short, long, flagged = await claimed(gw, runtime_id, 3, lease_seconds=30)
    await req(gw, "POST", f"/v1/tasks/{flagged['id']}/cancel")
    items = [item(short, lease_seconds=60), item(long, lease_seconds=3600), item(flagged)]
    items.append(item(short, lease_id=RANDOM_LEASE) | {"id": str(uuid.uuid4())})
    got = await results(gw, "heartbeat", items)
    assert [r["outcome"] for r in got] == ["extended"] * 3 + ["not_found"]
    assert [r["cancel_requested"] for r in got[:3]] == [False, False, True]
    for task, entry in zip((short, long, flagged), got, strict=False):
        stored = await get_task(gw, task["id"])
        assert entry["lease_expires_at"] == stored["lease_expires_at"]
        assert stored["lease_expires_at"] > task["lease_expires_at"]
    assert got[1]["lease_expires_at"] > got[0]["lease_expires_at"]
    lost = await results(gw, "heartbeat", [item(short, lease_id=RANDOM_LEASE)])
    problem_of(lost[0], "lease_lost", 409)


# -- lost leases and concurrent batches ------------------------------------------------


async def test_a_lease_reclaimed_between_claim_and_batch_complete_is_lease_lost(gw, runtime_id):
    kept, lapsed = await claimed(gw, runtime_id, 2, lease_seconds=1)
    await lease_op(gw, "heartbeat", kept, lease_seconds=600)
    await asyncio.sleep(1.15)
    await gw.gateway.janitor.run_once()  # takes the lapsed lease back
    again = await claim_one(gw, runtime_id, worker="other")
    assert again["id"] == lapsed["id"] and again["lease_id"] != lapsed["lease_id"]
    got = await results(gw, "complete", [item(kept, result="a"), item(lapsed, result="late")])
    assert got[0]["outcome"] == "completed"
    assert problem_of(got[1], "lease_lost", 409)["task_status"] == "claimed"
    # The new holder is untouched and can still report.
    assert (await get_task(gw, lapsed["id"]))["lease_id"] == again["lease_id"]
    assert (await results(gw, "complete", [item(again, result="b")]))[0]["outcome"] == "completed"
    assert (await get_task(gw, lapsed["id"]))["result"] == "b"


async def test_overlapping_batches_from_two_clients_report_each_task_once(gw, runtime_id):
    """Client A completes tasks 0-149, client B fails tasks 50-199 in reverse order, at
    the same time and with the same leases: every task of the overlap is reported by
    exactly one of them (the other gets lease_lost), and what is stored is the winner's.
    Reverse order also shows that batches locking the same rows do not deadlock."""
    for round_ in range(3):
        tasks = await claimed(gw, f"{runtime_id}-{round_}", 200)
        a_items = [item(t, result="A") for t in tasks[:150]]
        b_items = [item(t, error="B", retry=False) for t in reversed(tasks[50:])]
        a, b = await asyncio.gather(results(gw, "complete", a_items), results(gw, "fail", b_items))
        a_won = {r["id"] for r in a if r["outcome"] == "completed"}
        b_won = {r["id"] for r in b if r["outcome"] == "dead"}
        assert a_won.isdisjoint(b_won)
        assert a_won | b_won == {t["id"] for t in tasks}
        for answer, won in ((a, a_won), (b, b_won)):
            for r in answer:
                if r["id"] not in won:
                    problem_of(r, "lease_lost", 409)
        stored = await rows(
            gw,
            "SELECT id::text, status, result, last_error FROM tasks WHERE id = ANY($1::uuid[])",
            [uuid.UUID(t["id"]) for t in tasks],
        )
        for row in stored:
            if row["id"] in a_won:
                assert (row["status"], row["result"], row["last_error"]) == (
                    "completed",
                    b'"A"',
                    None,
                )
            else:
                assert (row["status"], row["result"], row["last_error"]) == ("dead", None, "B")


async def test_concurrent_repeats_of_one_batch_complete_each_task_once(gw, runtime_id):
    """Two clients sending the same completions (a retry racing the original): both
    answers say completed, as a repeated single complete does, and each task is
    completed once, with the result of the first to commit."""
    tasks = await claimed(gw, runtime_id, 100)
    first = [item(t, result="first") for t in tasks]
    second = [item(t, result="second") for t in reversed(tasks)]
    a, b = await asyncio.gather(results(gw, "complete", first), results(gw, "complete", second))
    assert {r["outcome"] for r in a + b} == {"completed"}
    stored = await rows(
        gw,
        "SELECT result FROM tasks WHERE id = ANY($1::uuid[])",
        [uuid.UUID(t["id"]) for t in tasks],
    )
    # One statement commits all its items at once: every task has the same writer.
    assert len({r["result"] for r in stored}) == 1 and len(stored) == 100


async def test_batches_sent_together_each_get_their_own_outcomes(gw, runtime_id):
    """Batches that arrive together may share a statement (gateway/claim/completions.py):
    each answer still holds its own items, in its order, each with its own outcome."""
    tasks = await claimed(gw, runtime_id, 80)
    batches = [tasks[k : k + 10] for k in range(0, 80, 10)]
    sends = []
    for n, group in enumerate(batches):
        items = [item(t, result=n) for t in group]
        items[n % 10] = item(group[n % 10], lease_id=RANDOM_LEASE, result="stolen")
        sends.append(results(gw, "complete", items))
    answers = await asyncio.gather(*sends)
    for n, (group, answer) in enumerate(zip(batches, answers, strict=True)):
        assert [r["id"] for r in answer] == [t["id"] for t in group]
        for k, r in enumerate(answer):
            if k == n % 10:
                problem_of(r, "lease_lost", 409)
                assert (await get_task(gw, r["id"]))["status"] == "claimed"
            else:
                assert r["outcome"] == "completed", r
                assert (await get_task(gw, r["id"]))["result"] == n


# -- isolation -------------------------------------------------------------------------


async def test_another_runtimes_task_is_not_found_and_unchanged(gw, runtime_id):
    mine = unique("mine")
    theirs = unique("theirs")
    (own,) = await claimed(gw, mine, 1)
    (foreign,) = await claimed(gw, theirs, 1)
    token = (await make_token(gw, ["claim"], [mine[:-2] + "*"]))["token"]
    before = await get_task(gw, foreign["id"])
    for op, extra in (("heartbeat", {}), ("fail", {"error": "x"}), ("complete", {})):
        got = await results(gw, op, [item(foreign, **extra), item(own, **extra)], auth=token)
        unknown = await req(
            gw, "POST", f"/v1/tasks/{foreign['id']}/{op}", item(foreign, **extra), auth=token
        )
        assert problem_of(got[0], "not_found", 404) == assert_problem(unknown, 404, "not_found")
        assert got[1]["outcome"] != "not_found"
        assert await get_task(gw, foreign["id"]) == before
    # A token without the claim scope may not call it at all.
    reader = (await make_token(gw, ["read"]))["token"]
    assert_problem(await batch(gw, "complete", [item(foreign)], auth=reader), 403, "forbidden")
    assert await get_task(gw, foreign["id"]) == before


# -- the whole request's problems --------------------------------------------------------


async def test_a_thousand_items_pass_and_one_more_is_refused_storing_nothing(gw, runtime_id):
    tasks = await claimed(gw, runtime_id, 1000)
    items = [item(t, result=i) for i, t in enumerate(tasks)]
    extra = {"id": str(uuid.uuid4()), "lease_id": RANDOM_LEASE}
    for op in ("complete", "fail", "heartbeat"):
        body = [{**i, "error": "e"} if op == "fail" else i for i in items] + [extra]
        resp = await batch(gw, op, body)
        assert_problem(resp, 422, "validation_failed", "tasks")
        assert "1001" in resp.body["detail"] and "1000" in resp.body["detail"]
    still = await rows(
        gw,
        "SELECT count(*) AS n FROM tasks WHERE runtime_id = $1 AND status = 'claimed'",
        runtime_id,
    )
    assert still == [{"n": 1000}]
    got = await results(gw, "complete", items)
    assert {r["outcome"] for r in got} == {"completed"}
    stored = await rows(
        gw, "SELECT result FROM tasks WHERE runtime_id = $1 ORDER BY payload::text::int", runtime_id
    )
    assert [r["result"] for r in stored] == [str(i).encode() for i in range(1000)]


INVALID = "validation_failed"


@pytest.mark.parametrize(
    ("op", "bad", "status", "code", "field"),
    [
        ("complete", {"lease_id": "nope"}, 422, INVALID, "tasks[1].lease_id"),
        ("complete", {"id": "nope"}, 422, INVALID, "tasks[1].id"),
        ("complete", {"id": None}, 422, INVALID, "tasks[1].id"),
        ("complete", {"result": "x" * (1 << 20)}, 413, "payload_too_large", "tasks[1].result"),
        ("complete", "duplicate", 422, INVALID, "tasks[1].id"),
        ("fail", {}, 422, INVALID, "tasks[1].error"),
        (
            "fail",
            {"error": "e", "retry_after_seconds": -1},
            422,
            INVALID,
            "tasks[1].retry_after_seconds",
        ),
        ("heartbeat", {"lease_seconds": 0}, 422, INVALID, "tasks[1].lease_seconds"),
        ("heartbeat", 7, 422, INVALID, "tasks[1]"),
    ],
)
async def test_a_malformed_item_refuses_the_batch_naming_it(
    gw, runtime_id, op, bad, status, code, field
):
    first, second = await claimed(gw, runtime_id, 2)
    good = item(first, error="e") if op == "fail" else item(first)
    if bad == "duplicate":
        wrong: Any = item(first)
    elif isinstance(bad, dict):
        wrong = {**item(second), **bad}
    else:
        wrong = bad
    query = "SELECT * FROM tasks WHERE runtime_id = $1 ORDER BY id"
    before = await rows(gw, query, runtime_id)
    problem = assert_problem(await batch(gw, op, [good, wrong]), status, code, field)
    assert problem["field"] == field and problem["index"] == 1, problem
    assert problem["detail"].startswith("tasks[1]: "), problem
    assert await rows(gw, query, runtime_id) == before


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"tasks": []}, 422, "tasks"),
        ({}, 422, "tasks"),
        ({"tasks": {"id": UNKNOWN_TASK}}, 422, "tasks"),
        ([], 400, None),
    ],
)
async def test_an_empty_or_shapeless_batch_is_refused(gw, body, status, field):
    for op in ("complete", "fail", "heartbeat"):
        resp = await req(gw, "POST", f"/v1/tasks:{op}", body)
        assert_problem(resp, status, None, field)
    resp = await req(gw, "POST", "/v1/tasks:complete", raw=b'{"tasks": [')
    assert_problem(resp, 400, "bad_request")


# -- wake-ups --------------------------------------------------------------------------


async def test_a_failed_task_queued_again_wakes_a_parked_poll_once_per_runtime(gw, runtime_id):
    other = f"{runtime_id}-b"
    held = await claimed(gw, runtime_id, 2) + await claimed(gw, other, 2)
    # Parked for 20 s, inside the verdict's 30 s life: only a wake-up ends it early
    # with a task; without one it answers an empty list when the wait runs out.
    poll = asyncio.create_task(claim(gw, runtime_id, worker="parked", wait_seconds=20))
    await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) == 1, 10, "the poll to park")
    bumps = sample(gw, "gateway_version_bumps_total", outcome="ok")
    got = await results(gw, "fail", [item(t, error="again", retry_after_seconds=0) for t in held])
    assert {r["outcome"] for r in got} == {"queued"}
    woken = await poll
    assert woken and woken[0]["id"] in {t["id"] for t in held[:2]}
    assert sample(gw, "gateway_version_bumps_total", outcome="ok") == bumps + 2


# -- the runtime check in SQL ------------------------------------------------------------

GLOB_CASES = [
    ("ci-*", "ci-linux"),
    ("ci-*", "cd-linux"),
    ("ci_a", "ci_a"),
    ("ci_a", "cixa"),  # _ is a plain character, not LIKE's any-one
    ("a*b*c", "axxbyyc"),
    ("a*b*c", "acb"),
    ("*", "anything.at:all"),
    ("x.y", "x.y"),
    ("x.y", "xzy"),
    ("**a", "a"),
    ("Ci-*", "ci-linux"),  # case matters
]


async def test_the_statements_runtime_check_matches_the_tokens_glob(gw):
    """ack_sql.RUNTIME_COVERED decides in SQL what auth.principals.glob_match decides for a task
    path: for a batch, it is the only check between a token and another's tasks."""
    covered = ack_sql.RUNTIME_COVERED.format(patterns="$1", runtime="$2::text")
    for pattern, runtime in GLOB_CASES:
        [row] = await rows(gw, f"SELECT {covered} AS covered", [pattern], runtime)
        assert row["covered"] is glob_match(pattern, runtime), (pattern, runtime)
    [row] = await rows(gw, f"SELECT {covered} AS covered", None, "any")
    assert row["covered"] is True  # a token for every runtime
