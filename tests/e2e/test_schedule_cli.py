"""`gateway schedule put|list|get|trigger|pause|resume|backfill|delete` against a real
gateway: what each prints (the gateway's answer, times as it writes them), its exit
code, and what the gateway stored; bad arguments and refusals say what is wrong and
store nothing."""

from __future__ import annotations

import json
from datetime import datetime

from gateway_client import AsyncClient
from tests.support.gateways import (
    TOKEN,
    client_command,
    make_settings,
    running_gateway,
)


async def schedule_cli(url: str, *args: str, token: str = TOKEN) -> tuple[int, str, str]:
    """`gateway schedule ARGS`: (exit code, stdout, stderr)."""
    return await client_command(url, "schedule", *args, token=token)


def is_gateway_time(value: str) -> bool:
    """The gateway's own form: RFC 3339 in UTC, microseconds, a Z."""
    return value.endswith("Z") and len(value) == len("2026-01-01T00:00:00.000000Z")


async def test_a_schedule_from_put_to_delete(database_url, redis_url, redis_prefix, runtime_id):
    rt = runtime_id
    async with (
        running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw,
        AsyncClient(gw.url, TOKEN) as client,
    ):
        code, out, err = await schedule_cli(
            gw.url,
            "put",
            rt,
            "sweep",
            "--every",
            "10",
            "--payload",
            '{"job": "sweep"}',
            # The trigger below enqueues even if the leader's pass made a tick's task
            # meanwhile (with the default, skip, it would be skipped).
            "--overlap",
            "allow",
        )
        assert code == 0, err
        made = json.loads(out)
        assert (made["every_seconds"], made["overlap"], made["payload"]) == (
            10,
            "allow",
            {"job": "sweep"},
        )
        assert len(made["upcoming"]) == 5 and all(map(is_gateway_time, made["upcoming"]))

        code, out, err = await schedule_cli(gw.url, "list", rt)
        assert code == 0 and [s["name"] for s in json.loads(out)["schedules"]] == ["sweep"]
        code, out, err = await schedule_cli(gw.url, "get", rt, "sweep")
        assert code == 0 and json.loads(out)["version"] == 1

        code, out, err = await schedule_cli(gw.url, "trigger", rt, "sweep")
        assert code == 0, err
        tick = json.loads(out)
        assert tick["outcome"] == "enqueued" and is_gateway_time(tick["tick_at"])
        task = await client.get(tick["task_id"])
        assert task.schedule == "sweep" and task.scheduled_for == datetime.fromisoformat(
            tick["tick_at"]
        )
        await client.enqueue(rt, {"not": "scheduled"})
        listed = (await client.list_tasks(rt, schedule="sweep")).tasks
        assert task.id in [t.id for t in listed] and {t.schedule for t in listed} == {"sweep"}

        code, out, err = await schedule_cli(gw.url, "pause", rt, "sweep", "--note", "quiet")
        assert code == 0 and (json.loads(out)["paused"], json.loads(out)["note"]) == (
            True,
            "quiet",
        )
        code, out, err = await schedule_cli(gw.url, "resume", rt, "sweep")
        assert code == 0 and json.loads(out)["paused"] is False

        code, out, err = await schedule_cli(gw.url, "backfill", rt, "sweep", "--start", "1m")
        assert code == 0, err
        filled = json.loads(out)
        # The minute's ticks before the PUT are new; one the leader's pass made since
        # (or the trigger's) is already enqueued, and makes no second task.
        assert filled["ticks"] in (5, 6, 7) and len(filled["enqueued"]) >= 5
        assert len(filled["enqueued"]) + filled["already_enqueued"] == filled["ticks"]
        for one in filled["enqueued"]:
            assert one["outcome"] == "enqueued" and is_gateway_time(one["tick_at"])
            assert datetime.fromisoformat(one["tick_at"]).second % 10 == 0

        code, out, err = await schedule_cli(gw.url, "delete", rt, "sweep")
        assert code == 0 and json.loads(out) == {"deleted": "sweep"}
        code, out, err = await schedule_cli(gw.url, "get", rt, "sweep")
        assert code == 1 and not out and "not_found" in err


async def test_bad_arguments_and_refusals_say_what_is_wrong(
    database_url, redis_url, redis_prefix, runtime_id
):
    rt = runtime_id
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        code, out, err = await schedule_cli(gw.url, "put", rt, "s")
        assert code == 2 and not out and "--cron" in err
        code, out, err = await schedule_cli(gw.url, "backfill", rt, "s", "--start", "soon")
        assert code == 2 and not out and "RFC 3339" in err
        code, out, err = await schedule_cli(gw.url, "put", rt, "s", "--cron", "0 0 30 2 *")
        assert code == 1 and not out and "cron" in err
        code, out, err = await schedule_cli(
            gw.url, "put", rt, "s", "--every", "60", "--timezone", "Mars/Olympus"
        )
        assert code == 1 and not out and "timezone" in err

        status, body = await gw.call(
            "POST", "/v1/admin/tokens", {"name": f"{rt}-read", "scopes": ["read"]}
        )
        assert status == 201, body
        reader = str(body["token"])
        code, out, err = await schedule_cli(gw.url, "put", rt, "s", "--every", "60", token=reader)
        assert code == 1 and not out
        assert "forbidden" in err and "enqueue scope" in err
        code, out, err = await schedule_cli(gw.url, "list", rt, token=reader)
        assert code == 0 and json.loads(out) == {"schedules": []}  # nothing was stored
