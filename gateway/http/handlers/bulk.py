"""HTTP handlers of a runtime's bulk operations: retry its dead, expired or cancelled
tasks, cancel its queued ones, a bounded number per call (store/bulk.py), and group its
recent errors for the console's failing view. Each task changes exactly as the single
retry or cancel changes one: a retry announces the runtime after its commit (I1), a
cancel wakes the waits on the results of the tasks it ended. They import no driver.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...api import decode, render
from ...api.bulk_bodies import parse_bulk_cancel, parse_bulk_retry, parse_errors_query
from ...errors import DatabaseBusy, StoreUnavailable
from ...instance import Gateway
from ..io import json_response, read_json


async def retry_tasks(request: Request, gw: Gateway) -> Response:
    """`{"retried": n, "more": bool}`. The runtime is announced after every run, even
    one that retried nothing: a row the statement locked and left was skipped by any
    claim in that instant (Store.retry_matching)."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    req = parse_bulk_retry(await read_json(request, gw.settings))
    try:
        change = await gw.store.retry_matching(runtime_id, req.status, req.error_prefix, req.limit)
    except DatabaseBusy:
        raise  # nothing was sent: nothing changed
    except StoreUnavailable:
        # It may have committed, its answer lost: the tasks it queued need their bump.
        await gw.claimer.announce(runtime_id)
        raise
    await gw.claimer.announce(runtime_id)
    return json_response({"retried": change.count, "more": change.more})


async def cancel_tasks(request: Request, gw: Gateway) -> Response:
    """`{"cancelled": n, "more": bool}`. No task became claimable: no bump, unless the
    statement failed (below)."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    limit = parse_bulk_cancel(await read_json(request, gw.settings))
    try:
        change = await gw.store.cancel_queued(runtime_id, limit)
    except DatabaseBusy:
        raise
    except StoreUnavailable:
        # Rolled back, a claim may have skipped the rows it held and found the runtime
        # empty over tasks that are still queued: the bump ends that verdict.
        await gw.claimer.announce(runtime_id)
        raise
    await gw.results.finished([(task_id, "cancelled") for task_id in change.task_ids])
    return json_response({"cancelled": change.count, "more": change.more})


async def error_groups(request: Request, gw: Gateway) -> Response:
    """The most common error lines among the runtime's recent tasks in a status."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    status, limit = parse_errors_query(request.query_params)
    groups, read, truncated = await gw.store.error_groups(runtime_id, status, limit)
    return json_response(
        {
            "runtime_id": runtime_id,
            "status": status,
            "groups": [
                {
                    "error": g.line,
                    "count": g.count,
                    "last_at": render.format_time(g.last_at),
                    "example_task_id": str(g.example_task_id),
                }
                for g in groups
            ],
            "tasks_read": read,
            "truncated": truncated,
        }
    )
