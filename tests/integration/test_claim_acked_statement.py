"""A claim that carries completes applies them in its own statement (leases.CLAIM_ACKED):
one statement, one round trip, no BEGIN or COMMIT; each complete answered as
`POST /v1/tasks:complete` answers it (completed, a replay, lease lost, not found, a
runtime its caller's token does not cover); the counts kept right; and the two parts
never touch each other's rows, even when both name the same runtime.

Each test has a freshly migrated database of its own (`own_database_url`), so that the
counts are exact.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.errors import LeaseLost, NotFound
from gateway.rows import CarriedCompletes
from gateway.store import Store
from gateway.store.sql.fragments import EFFECTIVE_STATUS
from tests.support.databases import fetch
from tests.support.stores import enqueue_request, open_store

pytestmark = pytest.mark.integration

TRUTH = f"""
SELECT {EFFECTIVE_STATUS} AS status, count(*) AS n FROM tasks WHERE runtime_id = $1 GROUP BY 1
"""


@pytest.fixture
async def store(own_database_url: str) -> AsyncIterator[Store]:
    async with open_store(own_database_url) as opened:
        yield opened


async def leased(store: Store, runtime_id: str, n: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """`n` tasks enqueued and claimed: (task id, lease id) each."""
    for i in range(n):
        await store.enqueue(runtime_id, enqueue_request(i))
    rows, _ = await store.claim(runtime_id, ["w"] * n, [60.0] * n)
    assert len(rows) == n
    return [(r.task.id, r.task.lease_id) for r in rows if r.task.lease_id is not None]


def carried(
    items: list[tuple[uuid.UUID, uuid.UUID]],
    runtimes: list[list[str] | None] | None = None,
) -> CarriedCompletes:
    return CarriedCompletes(
        [i for i, _ in items],
        [lease for _, lease in items],
        [f'{{"n": {n}}}' for n in range(len(items))],
        runtimes if runtimes is not None else [None] * len(items),
    )


async def statuses(database_url: str, runtime_id: str) -> dict[str, int]:
    return {r["status"]: r["n"] for r in await fetch(database_url, TRUTH, runtime_id)}


async def test_completes_and_leases_commit_in_one_statement(
    store: Store, own_database_url: str, runtime_id: str
) -> None:
    done = await leased(store, runtime_id, 3)
    for i in range(2):
        await store.enqueue(runtime_id, enqueue_request(10 + i))
    # A first run (with nothing to complete, on another runtime) lets the driver look
    # up its types beforehand.
    await store.claim_acked(runtime_id + "-warm-up", ["w"], [1.0], carried([]))
    sent: list[str] = []

    async def log_queries(conn: object) -> None:
        conn.add_query_logger(lambda record: sent.append(record.query))  # type: ignore[attr-defined]

    await store.run(log_queries)
    rows, due_in, outcomes = await store.claim_acked(
        runtime_id, ["w2", "w2", "w2"], [30.0] * 3, carried(done)
    )
    assert len(sent) == 1 and "unnest($5::uuid[]" in sent[0], sent
    # The two queued tasks are leased; the completed ones are never candidates.
    assert len(rows) == 2 and all(r.task.worker_id == "w2" for r in rows)
    assert {r.task.id for r in rows}.isdisjoint(i for i, _ in done)
    assert due_in is None
    assert [(o.task_id, o.status, o.error) for o in outcomes] == [
        (i, "completed", None) for i, _ in done
    ]
    assert all(o.runtime_id == runtime_id for o in outcomes)
    task = await store.get(done[1][0])
    assert task.status == "completed" and orjson.loads(orjson.dumps(task.result)) == {"n": 1}
    found, _ = await store.stats(runtime_id)
    assert {k: v for k, v in found.items() if v} == await statuses(own_database_url, runtime_id)
    assert await statuses(own_database_url, runtime_id) == {"completed": 3, "claimed": 2}


async def test_each_item_is_answered_as_a_batch_complete_answers_it(
    store: Store, runtime_id: str
) -> None:
    (first, second, third) = await leased(store, runtime_id, 3)
    await store.claim_acked(runtime_id, ["w"], [60.0], carried([first]))
    stranger = (uuid.uuid4(), uuid.uuid4())
    wrong_lease = (second[0], uuid.uuid4())
    _, _, outcomes = await store.claim_acked(
        runtime_id, ["w"], [60.0], carried([first, stranger, wrong_lease, third])
    )
    replay, missing, lost, completed = outcomes
    assert (replay.status, replay.error) == ("completed", None)  # a repeat by its lease
    assert isinstance(missing.error, NotFound) and missing.runtime_id is None
    assert isinstance(lost.error, LeaseLost) and lost.status == "claimed"
    assert (completed.status, completed.error) == ("completed", None)
    assert (await store.get(second[0])).status == "claimed"


async def test_each_item_is_bounded_by_its_own_callers_runtimes(
    store: Store, runtime_id: str
) -> None:
    """Items of several claims share the statement, each with its caller's patterns: a
    task outside them is not found to that item, and left as it was."""
    (mine, foreign, anyones) = await leased(store, runtime_id, 3)
    _, _, outcomes = await store.claim_acked(
        runtime_id + "-other",
        ["w"],
        [60.0],
        carried(
            [mine, foreign, anyones],
            [[runtime_id[:4] + "*", "elsewhere"], ["elsewhere-*"], None],
        ),
    )
    assert [o.status for o in outcomes] == ["completed", None, "completed"]
    assert isinstance(outcomes[1].error, NotFound)
    assert (await store.get(foreign[0])).status == "claimed"


async def test_a_claim_with_nothing_to_lease_still_applies_its_completes(
    store: Store, runtime_id: str
) -> None:
    (only,) = await leased(store, runtime_id, 1)
    rows, due_in, outcomes = await store.claim_acked(runtime_id, ["w"], [60.0], carried([only]))
    assert rows == [] and due_in is None
    assert [o.status for o in outcomes] == ["completed"]
    assert (await store.get(only[0])).status == "completed"
