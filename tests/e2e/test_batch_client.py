"""The client's batch calls (complete_many, fail_many, heartbeat_many), async and
blocking, against a real gateway: typed per-item outcomes, in the order given."""

from __future__ import annotations

import asyncio

import pytest

from gateway_client import (
    AsyncClient,
    Beat,
    Client,
    Completion,
    Failure,
    ItemOutcome,
    NewTask,
    ValidationFailed,
)
from tests.support.gateways import TOKEN

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]
NOBODY = "00000000-0000-4000-8000-000000000000"


async def test_async_batch_calls(gw, runtime_id):
    async with AsyncClient(gw.url, TOKEN) as client:
        await client.enqueue_batch(runtime_id, [NewTask(n) for n in range(4)])
        a, b, c, d = await client.claim(runtime_id, "w", max_tasks=4)
        assert a.lease_id and b.lease_id and c.lease_id and d.lease_id
        await client.cancel(d.id)

        beats = await client.heartbeat_many(
            [Beat(a.id, a.lease_id, 300), Beat(d.id, d.lease_id), Beat(NOBODY, a.lease_id)]
        )
        assert [x.outcome for x in beats] == ["extended", "extended", "not_found"]
        assert [x.cancel_requested for x in beats] == [False, True, False]
        assert a.lease_expires_at and beats[0].lease_expires_at
        assert beats[0].lease_expires_at > a.lease_expires_at
        assert beats[2].refused and beats[2].problem and beats[2].problem["status"] == 404

        failed = await client.fail_many(
            [
                Failure(b.id, b.lease_id, "later", retry_after_seconds=60),
                Failure(c.id, c.lease_id, "no", retry=False),
            ]
        )
        assert [x.outcome for x in failed] == ["queued", "dead"]
        assert failed[0].run_at == (await client.get(b.id)).run_at

        done = await client.complete_many(
            [
                Completion(a.id, a.lease_id, {"ok": 1}),
                Completion(d.id, d.lease_id),
                Completion(c.id, c.lease_id),
            ]
        )
        assert [x.outcome for x in done] == ["completed", "cancelled", "lease_lost"]
        assert done[2].problem and done[2].problem["task_status"] == "dead"
        assert (await client.get(a.id)).result == {"ok": 1}

        with pytest.raises(ValidationFailed) as info:
            await client.complete_many([Completion(a.id, a.lease_id), Completion(a.id, a.lease_id)])
        assert info.value.field == "tasks[1].id"


async def test_blocking_batch_calls(gw, runtime_id):
    async with AsyncClient(gw.url, TOKEN) as client:
        await client.enqueue_batch(runtime_id, [NewTask(n) for n in range(2)])
        tasks = await client.claim(runtime_id, "w", max_tasks=2)

    def blocking() -> list[ItemOutcome]:
        with Client(gw.url, TOKEN) as sync:
            beats = sync.heartbeat_many([Beat(t.id, t.lease_id or "") for t in tasks])
            assert [x.outcome for x in beats] == ["extended", "extended"]
            return sync.complete_many(
                [Completion(t.id, t.lease_id or "", t.payload) for t in tasks]
            )

    done = await asyncio.to_thread(blocking)
    assert [x.id for x in done] == [t.id for t in tasks]
    assert {x.outcome for x in done} == {"completed"}
