"""GET /v1/instance/load, the console's load panel (gateway/http/handlers/load.py): the
answering instance's line for a database connection and what it refused, by reason,
over the last minutes. Quiet when nothing is shed; while every connection is held and
work is refused at the door, it still answers (from memory, never refused itself) and
shows the refusals, the connections in use and the release waiting for one."""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime

import pytest

from tests.support.credentials import make_token
from tests.support.gateways import TOKEN, make_settings, running_gateway
from tests.support.http import req
from tests.support.stores import holding

pytestmark = pytest.mark.integration

LOAD = "/v1/instance/load"


async def test_quiet_then_shedding_as_the_line_fills(
    database_url, redis_url, redis_prefix, runtime_id
):
    settings = make_settings(
        database_url,
        redis_url,
        redis_prefix,
        db_pool_max=2,
        db_acquire_timeout_ms=10_000,
        db_queue_budget_ms=50,
    )
    async with running_gateway(settings) as gw:
        quiet = await req(gw, "GET", LOAD)
        assert quiet.status == 200, quiet.body
        body = quiet.body
        assert body["instance_id"] == gw.gateway.parked.instance
        assert body["host"] and "pid" not in body
        assert body["shedding"] is False and body["shed_last_minute"] == {}
        line = body["database_line"]
        assert (line["connections"], line["budget_ms"]) == (2, 50)
        assert line["waiting_work"] == line["waiting_releases"] == 0
        minutes = body["shed_per_minute"]
        assert len(minutes) == 10 and all(m["shed"] == {} for m in minutes)
        starts = [datetime.fromisoformat(m["minute"].replace("Z", "+00:00")) for m in minutes]
        assert all(s.second == 0 for s in starts)
        assert all((b - a).total_seconds() == 60 for a, b in itertools.pairwise(starts))
        # A client that left while its request waited is counted, but is not shedding.
        gw.gateway.store.recent_refusals().add("client_gone")
        left = (await req(gw, "GET", LOAD)).body
        assert left["shedding"] is False and left["shed_last_minute"] == {"client_gone": 1}

        # Enqueued and claimed, for a complete to wait in line below.
        tasks = f"/v1/runtimes/{runtime_id}/tasks"
        assert (await req(gw, "POST", tasks, {"payload": 1})).status == 201
        claimed = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/claim", {"worker_id": "w"})
        (task,) = claimed.body["tasks"]
        async with holding(gw.gateway.store, 2):
            await asyncio.sleep(0.3)  # every connection held past the budget: work is shed
            for _ in range(3):
                refused = await req(gw, "POST", tasks, {"payload": 2})
                assert refused.status == 503, refused.body
            complete = asyncio.create_task(
                req(
                    gw,
                    "POST",
                    f"/v1/tasks/{task['id']}/complete",
                    {"lease_id": task["lease_id"], "result": 1},
                )
            )
            async with asyncio.timeout(10):
                while gw.gateway.store.line_load().waiting_releases < 1:
                    await asyncio.sleep(0.02)
            # Asked while the line is full: read from memory, it waits for nothing. (The
            # admin token: an issued one is looked up again every 2 s, as a release is,
            # first in line, but with every connection held for good it would wait.)
            busy = await req(gw, "GET", LOAD)
            assert busy.status == 200, busy.body
            body = busy.body
            assert body["shedding"] is True
            assert body["shed_last_minute"] == {"database_queue": 3, "client_gone": 1}
            # In the latest minute, or the one before it when a minute ended meanwhile.
            recent = body["shed_per_minute"][-2:]
            assert sum(m["shed"].get("database_queue", 0) for m in recent) == 3
            assert sum(m["shed"].get("database_queue", 0) for m in body["shed_per_minute"]) == 3
            line = body["database_line"]
            assert line["connections_in_use"] == 2
            # The complete waits (and perhaps the gateway's own work: the janitor).
            assert line["waiting_work"] == 0 and line["waiting_releases"] >= 1
            assert line["work_limit"] is not None and line["mean_hold_ms"] > 0
        assert (await complete).status == 200


async def test_it_needs_a_read_token(database_url, redis_url, redis_prefix):
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        assert (await req(gw, "GET", LOAD, auth=None)).status == 401
        claimer = (await make_token(gw, ["claim"]))["token"]
        assert (await req(gw, "GET", LOAD, auth=claimer)).status == 403
        # The figures are the instance's: a token for other runtimes reads them too.
        reader = (await make_token(gw, ["read"], runtimes=["elsewhere-*"]))["token"]
        assert (await req(gw, "GET", LOAD, auth=reader)).status == 200
        assert (await req(gw, "GET", LOAD, auth=TOKEN)).status == 200
