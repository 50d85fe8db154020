"""The client against a real gateway: every endpoint, typed answers, and errors mapped
from the problem `code`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gateway_client import (
    AsyncClient,
    Client,
    Forbidden,
    InvalidState,
    LeaseLost,
    NewTask,
    NotFound,
    Unauthorized,
    ValidationFailed,
)
from tests.support.gateways import TOKEN, make_settings, running_gateway


async def test_every_endpoint(database_url, redis_url, redis_prefix, runtime_id):
    settings = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(runtime_id, {"n": 1}, priority=90, idempotency_key="k1")
        assert task.status == "queued" and task.priority == 90 and task.payload == {"n": 1}
        again = await client.enqueue(runtime_id, {"n": 1}, priority=90, idempotency_key="k1")
        assert again.id == task.id
        batch = await client.enqueue_batch(
            runtime_id, [NewTask({"n": 2}), NewTask({"n": 3}, delay_seconds=600)]
        )
        assert [t.payload for t in batch] == [{"n": 2}, {"n": 3}]

        claimed = await client.claim(runtime_id, "w1", max_tasks=5, wait_seconds=1)
        assert [t.id for t in claimed] == [task.id, batch[0].id]
        first, second = claimed
        assert first.lease_id and first.status == "claimed" and first.attempts == 1
        beat = await client.heartbeat(first.id, first.lease_id, lease_seconds=30)
        assert beat.cancel_requested is False
        done = await client.complete(first.id, first.lease_id, {"ok": True})
        assert done.status == "completed" and done.result == {"ok": True}
        with pytest.raises(LeaseLost) as lost:
            await client.heartbeat(first.id, "00000000-0000-0000-0000-000000000000")
        assert lost.value.status == 409 and lost.value.code == "lease_lost"

        released = await client.release(second.id, second.lease_id or "")
        assert released.status == "queued"
        again_claimed = await client.claim(runtime_id, "w1", wait_seconds=1)
        failed = await client.fail(
            again_claimed[0].id, again_claimed[0].lease_id or "", "boom", retry=False
        )
        assert failed.status == "dead" and failed.last_error == "boom"
        assert (await client.retry(failed.id)).status == "queued"
        assert (await client.cancel(failed.id)).status == "cancelled"
        with pytest.raises(InvalidState):
            await client.retry(task.id)  # completed: nothing to retry

        assert (await client.get(task.id)).status == "completed"
        with pytest.raises(NotFound):
            await client.get("00000000-0000-0000-0000-000000000000")
        page = await client.list_tasks(runtime_id, limit=2)
        assert len(page.tasks) == 2 and page.next_cursor is not None
        everything = [t.id async for t in client.iter_tasks(runtime_id, page_size=1)]
        assert len(everything) == 3
        stats = await client.stats(runtime_id)
        assert stats.counts["completed"] == 1 and stats.counts["cancelled"] == 1
        [summary] = [r async for r in client.iter_runtimes() if r.runtime_id == runtime_id]
        assert summary.claims_per_minute == 3  # two claimed at first, the released one again

        with pytest.raises(ValidationFailed) as bad:
            await client.claim(runtime_id, "w1", max_tasks=1000)
        assert bad.value.field == "max_tasks"
        async with AsyncClient(gw.url, "wrong") as stranger:
            with pytest.raises(Unauthorized):
                await stranger.stats(runtime_id)


async def test_scopes_map_to_forbidden(database_url, redis_url, redis_prefix, runtime_id):
    settings = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as admin:
        _, created, _ = await admin.request(
            "POST", "/v1/admin/tokens", {"name": runtime_id, "scopes": ["read"]}
        )
        async with AsyncClient(gw.url, created["token"]) as reader:
            with pytest.raises(Forbidden):
                await reader.enqueue(runtime_id, 1)


def test_sync_client_uses_the_environment(monkeypatch, database_url, redis_url, redis_prefix):
    """The blocking wrapper, configured by GATEWAY_URL and GATEWAY_TOKEN alone."""
    import asyncio
    import threading

    ready = threading.Event()
    stop = threading.Event()
    url: list[str] = []

    async def serve() -> None:
        settings = make_settings(database_url, redis_url, redis_prefix)
        async with running_gateway(settings) as gw:
            url.append(gw.url)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        assert ready.wait(20)
        monkeypatch.setenv("GATEWAY_URL", url[0])
        monkeypatch.setenv("GATEWAY_TOKEN", TOKEN)
        with Client() as client:
            task = client.enqueue("sync-rt", {"x": 1})
            assert client.get(task.id).payload == {"x": 1}
            assert [t.id for t in client.iter_tasks("sync-rt")] == [task.id]
    finally:
        stop.set()
        thread.join(30)


async def test_runtime_controls(database_url, redis_url, redis_prefix, runtime_id):
    """pause, resume, get_controls and set_controls, async and sync; KEEP leaves a
    control as it is and None removes a limit; a bad value is ValidationFailed."""
    settings = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        fresh = await client.get_controls(runtime_id)
        assert (fresh.paused, fresh.max_in_flight, fresh.updated_at) == (False, None, None)
        assert (await client.pause(runtime_id)).paused is True
        assert (await client.stats(runtime_id)).paused is True
        limited = await client.set_controls(runtime_id, max_in_flight=4, claims_per_second=2.5)
        assert (limited.paused, limited.max_in_flight, limited.claims_per_second) == (
            True,
            4,
            2.5,
        )
        assert (await client.resume(runtime_id)).paused is False
        unlimited = await client.set_controls(runtime_id, max_in_flight=None)
        assert (unlimited.max_in_flight, unlimited.claims_per_second) == (None, 2.5)
        with pytest.raises(ValidationFailed):
            await client.set_controls(runtime_id, max_in_flight=0)
        assert await client.get_controls(runtime_id) == unlimited
        until = datetime.now(UTC) + timedelta(hours=1)
        paused = await client.pause(runtime_id, reason="nightly export", until=until)
        assert (paused.paused, paused.paused_reason) == (True, "nightly export")
        assert paused.paused_until is not None and paused.paused_since is not None
        stats = await client.stats(runtime_id)
        assert (stats.paused_reason, stats.paused_until) == ("nightly export", paused.paused_until)
        with pytest.raises(ValidationFailed):
            await client.pause(runtime_id, until="2001-01-01T00:00:00Z")
        assert (await client.get_controls(runtime_id)).paused_reason == "nightly export"
        await client.resume(runtime_id)

        def sync_calls() -> None:
            with Client(gw.url, TOKEN) as sync:
                assert sync.pause(runtime_id, reason="sync").paused_reason == "sync"
                assert sync.pause(runtime_id).paused is True
                assert sync.set_controls(runtime_id, claims_per_second=None).paused is True
                assert sync.resume(runtime_id).paused is False
                assert sync.get_controls(runtime_id).claims_per_second is None

        await asyncio.to_thread(sync_calls)
