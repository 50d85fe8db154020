"""`GET /v1/instance/load`: how loaded the answering instance's database path is, for the
console's load panel and for an operator after a GatewayShedding alert.

Everything comes from this process's memory (gateway/admission.py, gateway/refusals.py):
the request waits for no database connection and is never refused for the line's
length, so it answers while the instance sheds, when it is wanted. It describes the
instance that answers it, named by `instance_id` (the id it reports to the other
instances) and `host` (the pod's name under Kubernetes): behind a load balancer, each
request may reach another instance, and each answer says which it was.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response

from ...api.render import format_time
from ...instance import Gateway
from ..io import json_response

# Read once: a process's host name does not change while it runs. (Not its process id:
# any token that may read tasks may read this, and the id says nothing it needs.)
HOST = socket.gethostname()


async def instance_load(request: Request, gw: Gateway) -> Response:
    """The database line now (its connections, what waits, the limit on waiting work)
    and the requests refused before any work, by reason, over the last minutes."""
    line = gw.store.line_load()
    refusals = gw.store.recent_refusals()
    last_minute = refusals.last_minute()
    return json_response(
        {
            "instance_id": gw.parked.instance,
            "host": HOST,
            # Refused for load; a client that left while it waited is not shedding.
            "shedding": bool(last_minute.get("database_queue") or last_minute.get("busy")),
            "database_line": {
                "connections": line.connections,
                "connections_in_use": line.held,
                "waiting_work": line.waiting_work,
                "waiting_releases": line.waiting_releases,
                "work_limit": None if line.limit is None else round(line.limit, 1),
                "mean_hold_ms": round(line.hold_ms, 3),
                "budget_ms": line.budget_ms,
                "standing": line.standing,
            },
            "shed_last_minute": last_minute,
            "shed_per_minute": [
                {
                    "minute": format_time(datetime.fromtimestamp(minute.start, UTC)),
                    "shed": minute.counts,
                }
                for minute in refusals.per_minute()
            ],
        }
    )
