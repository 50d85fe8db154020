"""Ids reach a real gateway whole: the client quotes each one as a single path segment,
so an id holding `?`, `#`, `%` or a space is judged by the gateway as the id it is (and
refused by its runtime-id rule), never cut into a path and a query or a fragment that
would name another runtime or task; an id that no URL path can carry (`/`, `.`, `..`)
is refused by the client before any request."""

from __future__ import annotations

import pytest

from gateway_client import AsyncClient, NewTask, NotFound, ValidationFailed
from tests.support.gateways import TOKEN, make_settings, running_gateway

# Each would, unquoted, reach the gateway as runtime `rt-x` (the rest a query, a
# fragment, an escape or a broken request line).
HOSTILE = ("?", "#", "%", " ", "%2F", "%3F")


async def test_hostile_ids_reach_the_gateway_as_one_segment(
    database_url, redis_url, redis_prefix, runtime_id
):
    settings = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        for cut in HOSTILE:
            hostile = f"{runtime_id}{cut}x"
            with pytest.raises(ValidationFailed) as refused:
                await client.enqueue(hostile, {"n": 1})
            # The gateway's own answer, naming the field: the id arrived, whole.
            assert (refused.value.status, refused.value.field) == (422, "runtime_id"), cut
            with pytest.raises(ValidationFailed) as refused:
                await client.stats(hostile)
            assert refused.value.status == 422, cut
            with pytest.raises(NotFound) as missing:
                await client.get(f"00000000-0000-0000-0000-000000000000{cut}x")
            assert f"0000{cut}x" in missing.value.detail, missing.value.detail
        # Nothing reached the runtime that the ids begin with.
        assert (await client.stats(runtime_id)).counts["queued"] == 0

        for unaddressable in ("a/b", f"{runtime_id}/tasks", ".", ".."):
            with pytest.raises(ValidationFailed) as refused:
                await client.enqueue(unaddressable, {"n": 1})
            assert refused.value.status is None and refused.value.field == "runtime_id"
            assert "cannot be sent in a URL path" in refused.value.detail
        with pytest.raises(ValidationFailed) as refused:
            await client.cancel("../runtimes/x")
        assert refused.value.status is None and refused.value.field == "task_id"
        assert (await client.stats(runtime_id)).counts["queued"] == 0


async def test_ids_with_every_allowed_character_work_everywhere(
    database_url, redis_url, redis_prefix, runtime_id
):
    """The gateway's runtime ids may hold `.`, `_`, `:` and `-`; quoted, they still
    name the runtime in every kind of path, `:pause` and `/tasks:batch` included."""
    odd = f"{runtime_id}.a_b:c-d"
    settings = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(odd, {"n": 1})
        assert task.runtime_id == odd
        (later,) = await client.enqueue_batch(odd, [NewTask({"n": 2}, delay_seconds=600)])
        assert later.runtime_id == odd
        assert (await client.pause(odd, reason="x")).runtime_id == odd
        assert (await client.resume(odd)).paused is False
        assert (await client.get_controls(odd)).runtime_id == odd
        assert [t.id for t in (await client.list_tasks(odd)).tasks] == [task.id, later.id]
        (claimed,) = await client.claim(odd, "w1")
        assert claimed.id == task.id and claimed.lease_id
        assert (await client.complete(task.id, claimed.lease_id)).status == "completed"
        assert (await client.stats(odd)).counts["completed"] == 1
