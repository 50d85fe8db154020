"""`gateway runtime pause|resume|limits|show` against a real gateway: what each prints,
its exit code, and what the gateway stored."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta

from gateway_client import AsyncClient
from tests.support.gateways import (
    TOKEN,
    client_command,
    client_env,
    make_settings,
    running_gateway,
)


async def runtime_cli(url: str, *args: str, token: str = TOKEN) -> tuple[int, str, str]:
    """`gateway runtime ARGS`: (exit code, stdout, stderr)."""
    return await client_command(url, "runtime", *args, token=token)


async def test_pause_resume_limits_and_show(database_url, redis_url, redis_prefix, runtime_id):
    """Each action prints the controls after it as JSON, and the gateway stored them."""
    async with (
        running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw,
        AsyncClient(gw.url, TOKEN) as client,
    ):
        code, out, err = await runtime_cli(gw.url, "show", runtime_id)
        assert code == 0, err
        assert json.loads(out)["paused"] is False and json.loads(out)["updated_at"] is None

        code, out, err = await runtime_cli(
            gw.url, "pause", runtime_id, "--reason", "disk full", "--until", "2h"
        )
        assert code == 0, err
        shown = json.loads(out)
        assert (shown["paused"], shown["paused_reason"]) == (True, "disk full")
        until = datetime.fromisoformat(shown["paused_until"].replace("Z", "+00:00"))
        assert timedelta(hours=1.9) < until - datetime.now(UTC) <= timedelta(hours=2)
        stored = await client.get_controls(runtime_id)
        assert (stored.paused_reason, stored.paused_until) == ("disk full", until)

        code, out, err = await runtime_cli(
            gw.url, "pause", runtime_id, "--until", "2099-01-02T03:04:05Z"
        )
        assert code == 0, err
        assert json.loads(out)["paused_until"] == "2099-01-02T03:04:05.000000Z"
        assert json.loads(out)["paused_reason"] is None

        code, out, err = await runtime_cli(gw.url, "resume", runtime_id)
        assert code == 0, err
        assert json.loads(out)["paused"] is False
        assert (await client.get_controls(runtime_id)).paused is False

        code, out, err = await runtime_cli(
            gw.url, "limits", runtime_id, "--max-in-flight", "4", "--claims-per-second", "0.5"
        )
        assert code == 0, err
        assert (json.loads(out)["max_in_flight"], json.loads(out)["claims_per_second"]) == (4, 0.5)
        code, out, err = await runtime_cli(gw.url, "limits", runtime_id, "--max-in-flight", "none")
        assert code == 0, err
        stored = await client.get_controls(runtime_id)
        assert (stored.max_in_flight, stored.claims_per_second) == (None, 0.5)

        code, out, _ = await runtime_cli(gw.url, "show", runtime_id)
        assert code == 0 and json.loads(out)["claims_per_second"] == 0.5


async def test_bad_arguments_and_refusals_say_what_is_wrong(
    database_url, redis_url, redis_prefix, runtime_id
):
    """Bad arguments exit 2 before any call; the gateway's refusals exit 1 naming the
    field, or, for a 403, the scope needed; nothing is stored."""
    async with (
        running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw,
        AsyncClient(gw.url, TOKEN) as client,
    ):
        code, out, err = await runtime_cli(gw.url, "limits", runtime_id)
        assert code == 2 and not out and "--max-in-flight" in err
        code, out, err = await runtime_cli(gw.url, "limits", runtime_id, "--max-in-flight", "x")
        assert code == 2 and not out and "whole number or none" in err
        code, out, err = await runtime_cli(gw.url, "pause", runtime_id, "--until", "soon")
        assert code == 2 and not out and "RFC 3339" in err
        code, out, err = await runtime_cli(
            gw.url, "pause", runtime_id, "--until", "2001-01-01T00:00:00Z"
        )
        assert code == 1 and not out and "until" in err and "future" in err
        code, out, err = await runtime_cli(gw.url, "pause", runtime_id, "--reason", "x" * 501)
        assert code == 1 and "reason" in err
        code, out, err = await runtime_cli(gw.url, "limits", runtime_id, "--max-in-flight", "0")
        assert code == 1 and "max_in_flight" in err
        assert (await client.get_controls(runtime_id)).updated_at is None

        status, body = await gw.call(
            "POST", "/v1/admin/tokens", {"name": f"{runtime_id}-read", "scopes": ["read"]}
        )
        assert status == 201, body
        reader = str(body["token"])
        code, out, err = await runtime_cli(gw.url, "pause", runtime_id, token=reader)
        assert code == 1 and not out
        assert "forbidden" in err and "control (or admin) scope" in err
        code, out, err = await runtime_cli(gw.url, "show", runtime_id, token=reader)
        assert code == 0, err
        code, out, err = await runtime_cli(gw.url, "show", runtime_id, token="bad")
        assert code == 1 and "unauthorized" in err
        assert (await client.get_controls(runtime_id)).paused is False


async def test_help_explains_the_actions_and_exit_codes() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "runtime", "pause", "--help",
        env=client_env("http://127.0.0.1:9", TOKEN), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    text = " ".join(out.decode().split())
    assert "--reason" in text and "--until" in text and "duration from now" in text
    assert "0 done, 1 the gateway refused" in text and "2 bad arguments" in text
    assert "control scope" in text
