"""The client's bulk calls against a real gateway, async and blocking: a runtime's dead
tasks grouped by error, one group retried by its line, queued tasks cancelled, and bad
input refused naming the field."""

from __future__ import annotations

import asyncio

import pytest

from gateway_client import AsyncClient, BulkOutcome, Client, Failure, NewTask, ValidationFailed
from tests.support.gateways import TOKEN

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def dead(client: AsyncClient, runtime: str, errors: list[str]) -> None:
    await client.enqueue_batch(runtime, [NewTask(i, max_attempts=1) for i in range(len(errors))])
    tasks = await client.claim(runtime, "w", max_tasks=len(errors))
    items = [
        Failure(t.id, t.lease_id or "", e, retry=False) for t, e in zip(tasks, errors, strict=True)
    ]
    assert {x.outcome for x in await client.fail_many(items)} == {"dead"}


async def test_async_bulk_calls(gw, runtime_id):
    async with AsyncClient(gw.url, TOKEN) as client:
        await dead(client, runtime_id, ["timeout\nat x", "timeout\nat y", "refused 100%"])
        found = await client.error_groups(runtime_id)
        assert found.runtime_id == runtime_id and found.status == "dead"
        assert [(g.error, g.count) for g in found.groups] == [("timeout", 2), ("refused 100%", 1)]
        assert found.tasks_read == 3 and not found.truncated
        assert found.groups[0].last_at.tzinfo is not None
        assert (await client.get(found.groups[0].example_task_id)).status == "dead"
        assert len((await client.error_groups(runtime_id, limit=1)).groups) == 1

        retried = await client.retry_tasks(runtime_id, "dead", error_prefix="timeout", limit=1)
        assert retried == BulkOutcome(1, True)
        assert await client.retry_tasks(runtime_id, "dead", error_prefix="timeout") == (
            BulkOutcome(1, False)
        )
        assert (await client.error_groups(runtime_id)).groups[0].error == "refused 100%"
        assert await client.cancel_tasks(runtime_id) == BulkOutcome(2, False)
        assert (await client.error_groups(runtime_id, "cancelled")).groups[0].count == 2

        with pytest.raises(ValidationFailed) as refused:
            await client.retry_tasks(runtime_id, "dead", limit=0)
        assert refused.value.field == "limit"


async def test_blocking_bulk_calls(gw, runtime_id):
    async with AsyncClient(gw.url, TOKEN) as client:
        await dead(client, runtime_id, ["boom"])
        await client.enqueue(runtime_id, "queued")

    def blocking() -> tuple[BulkOutcome, BulkOutcome, int]:
        with Client(gw.url, TOKEN) as sync:
            groups = sync.error_groups(runtime_id, "dead", limit=5)
            return (
                sync.retry_tasks(runtime_id, "dead", error_prefix=groups.groups[0].error),
                sync.cancel_tasks(runtime_id, limit=10),
                groups.groups[0].count,
            )

    retried, cancelled, count = await asyncio.to_thread(blocking)
    assert (retried, cancelled, count) == (BulkOutcome(1, False), BulkOutcome(2, False), 1)
