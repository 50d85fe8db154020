"""The client's `minimal=True` on enqueue and enqueue_batch, async and blocking, against
a real gateway: it sends `Prefer: return=minimal` and returns the tasks' ids, in the
order given; a replay returns the stored task's id."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http.handlers import producer as producer_routes
from gateway_client import AsyncClient, Client, NewTask, ValidationFailed
from tests.support.gateways import TOKEN

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]


def spy_on_answers(client: AsyncClient) -> list[tuple[Any, Any]]:
    """(body, headers) of every answer the client receives from now on."""
    answers: list[tuple[Any, Any]] = []
    request = client.request

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        status, data, headers = await request(*args, **kwargs)
        answers.append((data, headers))
        return status, data, headers

    client.request = recorded  # type: ignore[method-assign]
    return answers


async def test_async_minimal_enqueues_return_ids(gw, runtime_id):
    async with AsyncClient(gw.url, TOKEN) as client:
        answers = spy_on_answers(client)
        ids = await client.enqueue_batch(
            runtime_id, [NewTask(n, idempotency_key=f"k{n}") for n in range(3)], minimal=True
        )
        assert all(isinstance(i, str) for i in ids)
        one = await client.enqueue(runtime_id, "one", priority=7, minimal=True)
        assert isinstance(one, str)
        # The gateway was asked for ids only, and answered so.
        assert [a[1].get("Preference-Applied") for a in answers] == ["return=minimal"] * 2
        assert answers[0][0] == {"tasks": [{"id": i} for i in ids]}
        assert answers[1][0] == {"id": one}
        listed = (await client.list_tasks(runtime_id)).tasks
        assert [t.id for t in listed] == [*ids, one]
        assert [t.payload for t in listed] == [0, 1, 2, "one"] and listed[3].priority == 7
        # Replays: the ids of the tasks the keys made.
        again = await client.enqueue_batch(
            runtime_id, [NewTask(2, idempotency_key="k2"), NewTask(9)], minimal=True
        )
        assert again[0] == ids[2] and again[1] not in ids
        assert await client.enqueue(runtime_id, 0, idempotency_key="k0", minimal=True) == ids[0]
        # The whole tasks, as before, without it.
        [task] = await client.enqueue_batch(runtime_id, [NewTask("whole")])
        assert task.payload == "whole" and task.status == "queued"
        with pytest.raises(ValidationFailed) as info:
            await client.enqueue_batch(
                runtime_id, [NewTask(1), NewTask(2, priority=-1)], minimal=True
            )
        assert info.value.field == "tasks[1].priority"


async def test_blocking_minimal_enqueues_return_ids(gw, runtime_id):
    def blocking() -> tuple[list[str], str]:
        with Client(gw.url, TOKEN) as sync:
            ids = sync.enqueue_batch(runtime_id, [NewTask("a"), NewTask("b")], minimal=True)
            return ids, sync.enqueue(runtime_id, "c", minimal=True)

    ids, one = await asyncio.to_thread(blocking)
    async with AsyncClient(gw.url, TOKEN) as client:
        listed = (await client.list_tasks(runtime_id)).tasks
    assert [t.id for t in listed] == [*ids, one]
    assert [t.payload for t in listed] == ["a", "b", "c"]


async def test_minimal_against_a_gateway_that_answers_whole_tasks(gw, runtime_id, monkeypatch):
    # A gateway from before `Prefer: return=minimal` ignores the header (RFC 7240 lets
    # any server do so) and answers whole tasks: the client takes the ids from those.
    monkeypatch.setattr(producer_routes, "prefers_minimal", lambda values: False)
    async with AsyncClient(gw.url, TOKEN) as client:
        answers = spy_on_answers(client)
        items = [NewTask(n, idempotency_key="k" if n == 1 else None) for n in range(3)]
        ids = await client.enqueue_batch(runtime_id, items, minimal=True)
        one = await client.enqueue(runtime_id, "one", minimal=True)
        replayed = await client.enqueue(runtime_id, 1, idempotency_key="k", minimal=True)
        assert all("Preference-Applied" not in headers for _, headers in answers)
        assert "payload" in answers[0][0]["tasks"][0] and "payload" in answers[1][0]
        assert all(isinstance(i, str) for i in [*ids, one]) and replayed == ids[1]
        listed = (await client.list_tasks(runtime_id)).tasks
        assert [t.id for t in listed] == [*ids, one]
