"""The schedules API over HTTP: create, replace idempotently, read with the next ticks,
list, trigger under the overlap policy, pause and resume, backfill each tick once,
delete; the tasks it makes and `?schedule=` on the listing; validation that names the
field and stores nothing; and the scopes (`enqueue` manages, `read` reads, on the
runtimes a token covers). The tick pass itself is driven by the test
(`gateway.scheduler.run_once()`); another gateway of the session's database may run
passes too, so the checks read what was made, not what one pass reports."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.credentials import make_token
from tests.support.gateways import Instance
from tests.support.http import req

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]


def path(rt: str, name: str = "", op: str = "") -> str:
    return f"/v1/runtimes/{rt}/schedules" + (f"/{name}" if name else "") + op


async def put(gw: Instance, rt: str, name: str, **body: Any) -> Any:
    body.setdefault("payload", {"from": name})
    return await req(gw, "PUT", path(rt, name), body)


async def due_now(gw: Instance, rt: str, name: str, ticks: int) -> None:
    """The next tick of the (every_seconds) schedule moved `ticks` ticks back, so that a
    pass has that many to decide."""
    await gw.gateway.store.run(
        lambda c: c.execute(
            "UPDATE schedules SET next_tick_at = to_timestamp(every_seconds * "
            "(floor(extract(epoch FROM clock_timestamp()) / every_seconds) - $3 + 1)) "
            "WHERE runtime_id = $1 AND name = $2",
            rt,
            name,
            ticks,
        )
    )


async def made(gw: Instance, rt: str, name: str) -> list[dict[str, Any]]:
    """The tasks the schedule made, oldest first (`?schedule=`)."""
    listed = await req(gw, "GET", f"/v1/runtimes/{rt}/tasks?schedule={name}")
    assert listed.status == 200, listed.body
    tasks: list[dict[str, Any]] = listed.body["tasks"]
    return tasks


async def test_a_schedule_lives_from_put_to_delete(gw: Instance, runtime_id: str) -> None:
    rt = runtime_id
    created = await put(gw, rt, "tick", every_seconds=10, overlap="allow", note="try")
    assert created.status == 201, created.body
    s = created.body
    assert (s["every_seconds"], s["timezone"], s["overlap"], s["version"]) == (
        10,
        "UTC",
        "allow",
        1,
    )
    assert len(s["upcoming"]) == 5 and s["next_run_at"] == s["upcoming"][0]
    ticks = [datetime.fromisoformat(t) for t in s["upcoming"]]
    assert all(int(t.timestamp()) % 10 == 0 for t in ticks)
    assert [b - a for a, b in itertools.pairwise(ticks)] == [timedelta(seconds=10)] * 4

    again = await put(gw, rt, "tick", every_seconds=10, overlap="allow", note="try")
    assert again.status == 200 and again.body["version"] == 1, again.body  # idempotent
    read = await req(gw, "GET", path(rt, "tick"))
    # The same ticks, or one on if the first one's time passed in between (the PUT
    # came just before a 10 s boundary).
    upcoming = read.body["upcoming"]
    assert read.status == 200 and upcoming in (s["upcoming"], s["upcoming"][1:] + upcoming[-1:])

    # The tick pass makes the due ticks' tasks; the listing filters by schedule.
    await due_now(gw, rt, "tick", 3)
    await gw.gateway.scheduler.run_once()
    tasks = await made(gw, rt, "tick")
    assert len(tasks) >= 3, tasks
    assert {t["schedule"] for t in tasks} == {"tick"}
    assert all(t["scheduled_for"].endswith("0.000000Z") for t in tasks)
    await gw.enqueue(rt, {"not": "scheduled"})
    assert len((await req(gw, "GET", f"/v1/runtimes/{rt}/tasks")).body["tasks"]) == len(tasks) + 1
    read = await req(gw, "GET", path(rt, "tick"))
    assert read.body["last_task_id"] == tasks[-1]["id"]
    assert read.body["last_task_status"] == "queued"

    # A backfill of what the pass did makes nothing twice. (A tick within the next
    # 2 s may have been decided ahead: the range stops at the last one past.)
    now = datetime.now(UTC)
    past = [t for t in tasks if datetime.fromisoformat(t["scheduled_for"]) <= now]
    start = past[0]["scheduled_for"]
    end = past[-1]["scheduled_for"]
    filled = await req(gw, "POST", path(rt, "tick", ":backfill"), {"start": start, "end": end})
    assert filled.status == 200, filled.body
    assert filled.body["enqueued"] == [] and filled.body["already_enqueued"] == len(past)

    paused = await req(gw, "POST", path(rt, "tick", ":pause"), {"note": "quiet"})
    assert paused.body["paused"] is True and paused.body["note"] == "quiet"
    assert paused.body["next_run_at"] is None and paused.body["upcoming"] == []
    # The pause withdrew a tick decided ahead whose time had not come; the rest stay.
    kept = await made(gw, rt, "tick")
    paused_at = datetime.fromisoformat(paused.body["updated_at"])
    assert {t["id"] for t in past} <= {t["id"] for t in kept}
    assert all(datetime.fromisoformat(t["scheduled_for"]) <= paused_at for t in kept)
    await due_now(gw, rt, "tick", 3)
    await gw.gateway.scheduler.run_once()
    assert len(await made(gw, rt, "tick")) == len(kept)  # a paused one ticks not
    resumed = await req(gw, "POST", path(rt, "tick", ":resume"))
    assert resumed.body["paused"] is False
    assert datetime.fromisoformat(resumed.body["next_run_at"]) > datetime.fromisoformat(end)

    listing = await req(gw, "GET", path(rt) + "?limit=1")
    assert [x["name"] for x in listing.body["schedules"]] == ["tick"]
    assert listing.body["next_cursor"] is None

    assert (await req(gw, "DELETE", path(rt, "tick"))).status == 204
    assert (await req(gw, "GET", path(rt, "tick"))).status == 404
    assert (await req(gw, "DELETE", path(rt, "tick"))).status == 404
    assert len(await made(gw, rt, "tick")) == len(kept)  # its tasks stay


async def test_trigger_follows_the_overlap_policy(gw: Instance, runtime_id: str) -> None:
    rt = runtime_id
    assert (await put(gw, rt, "skip", cron="0 3 * * *")).status == 201
    first = await req(gw, "POST", path(rt, "skip", ":trigger"))
    assert first.status == 200 and first.body["outcome"] == "enqueued", first.body
    # skip (the default): the first task is still queued.
    second = await req(gw, "POST", path(rt, "skip", ":trigger"))
    assert second.body == {**second.body, "outcome": "skipped_overlap", "task_id": None}

    assert (await put(gw, rt, "newest", cron="0 3 * * *", overlap="cancel_previous")).status == 201
    old = (await req(gw, "POST", path(rt, "newest", ":trigger"))).body["task_id"]
    new = (await req(gw, "POST", path(rt, "newest", ":trigger"))).body["task_id"]
    assert new != old
    assert (await req(gw, "GET", f"/v1/tasks/{old}")).body["status"] == "cancelled"
    assert (await req(gw, "GET", f"/v1/tasks/{new}")).body["status"] == "queued"
    assert (await req(gw, "POST", path(rt, "nothing", ":trigger"))).status == 404


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("s", {"cron": "61 * * * *"}, "cron"),
        ("s", {"cron": "0 0 30 2 *"}, "cron"),
        ("s", {"cron": "0 3 * * *", "timezone": "Nowhere/Land"}, "timezone"),
        ("s", {"every_seconds": 0}, "every_seconds"),
        ("s", {"every_seconds": 1.5}, "every_seconds"),
        ("s", {"cron": "0 3 * * *", "every_seconds": 60}, "every_seconds"),
        ("s", {}, "cron"),
        ("s", {"every_seconds": 60, "overlap": "sometimes"}, "overlap"),
        ("s", {"every_seconds": 60, "jitter_seconds": -1}, "jitter_seconds"),
        ("s", {"every_seconds": 60, "colour": "red"}, "colour"),
        ("bad:name", {"every_seconds": 60}, "name"),
        ("x" * 65, {"every_seconds": 60}, "name"),
    ],
)
async def test_bad_definitions_are_refused_naming_the_field_and_store_nothing(
    gw: Instance, runtime_id: str, name: str, body: dict[str, Any], field: str
) -> None:
    resp = await req(gw, "PUT", path(runtime_id, name), {"payload": 1, **body})
    assert resp.status == 422, resp.body
    assert resp.body["field"] == field, resp.body
    assert (await req(gw, "GET", path(runtime_id))).body["schedules"] == []


async def test_a_backfill_is_bounded_to_the_past_and_the_tick_record(
    gw: Instance, runtime_id: str
) -> None:
    rt = runtime_id
    await put(gw, rt, "m", every_seconds=60)
    now = datetime.now().astimezone()
    cases = [
        ({"start": (now - timedelta(minutes=5)).isoformat()}, "end"),
        ({"start": now.isoformat(), "end": (now + timedelta(hours=1)).isoformat()}, "end"),
        ({"start": now.isoformat(), "end": (now - timedelta(hours=1)).isoformat()}, "start"),
        ({"start": (now - timedelta(days=31)).isoformat(), "end": now.isoformat()}, "start"),
        ({"start": (now - timedelta(days=2)).isoformat(), "end": now.isoformat()}, "end"),
    ]
    for body, field in cases:
        resp = await req(gw, "POST", path(rt, "m", ":backfill"), body)
        assert (resp.status, resp.body.get("field")) == (422, field), (body, resp.body)
    body = {"start": (now - timedelta(minutes=3)).isoformat(), "end": now.isoformat()}
    first = await req(gw, "POST", path(rt, "m", ":backfill"), body)
    assert first.status == 200 and first.body["ticks"] == len(first.body["enqueued"]) >= 2
    second = await req(gw, "POST", path(rt, "m", ":backfill"), body)
    assert second.body["enqueued"] == [] and second.body["already_enqueued"] == first.body["ticks"]


async def test_enqueue_manages_and_read_reads_on_covered_runtimes_only(
    gw: Instance, runtime_id: str
) -> None:
    rt = runtime_id
    assert (await put(gw, rt, "s", every_seconds=60)).status == 201
    reader = (await make_token(gw, ["read"], [rt]))["token"]
    producer = (await make_token(gw, ["enqueue"], [rt]))["token"]
    elsewhere = (await make_token(gw, ["enqueue", "read"], [rt + "-other"]))["token"]
    body = {"every_seconds": 30, "payload": 2}
    assert (await req(gw, "GET", path(rt, "s"), auth=reader)).status == 200
    assert (await req(gw, "GET", path(rt), auth=reader)).status == 200
    for method, target, sent in (
        ("PUT", path(rt, "s"), body),
        ("DELETE", path(rt, "s"), None),
        ("POST", path(rt, "s", ":trigger"), None),
        ("POST", path(rt, "s", ":pause"), None),
    ):
        resp = (
            await req(gw, method, target, sent, auth=reader)
            if sent
            else await req(gw, method, target, auth=reader)
        )
        assert resp.status == 403, (method, target, resp.body)
        other = await req(gw, method, target, auth=elsewhere)
        assert other.status == 403, (method, target, other.body)
    assert (await req(gw, "GET", path(rt, "s"), auth=elsewhere)).status == 403
    assert (await req(gw, "PUT", path(rt, "s"), body, auth=producer)).status == 200
    assert (await req(gw, "GET", path(rt, "s"))).body["every_seconds"] == 30
    assert (await req(gw, "POST", path(rt, "s", ":trigger"), auth=producer)).status == 200
    assert (await req(gw, "DELETE", path(rt, "s"), auth=producer)).status == 204
