"""HTTP handlers. They parse, call the store and the claimer, and shape answers;
they import no driver. Errors become problem+json in `api()` via errors.PROBLEMS.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as ASGIScope

from . import (
    admin,
    admin_docs,
    batch,
    controls_routes,
    docs,
    models,
    openapi,
    results,
    runtimes,
    webhooks,
)
from .auth import Principal, Scope
from .errors import GatewayError, NotFound, StoreUnavailable
from .httpio import (
    CLIENT_LEFT,
    DirectRoute,
    DisconnectWatch,
    empty_tasks_response,
    internal_error_response,
    json_response,
    problem_response,
    read_json,
)
from .metrics import CONTENT_TYPE
from .rows import Leased, as_enqueued
from .runtime import Gateway
from .waiters import Departure

log = logging.getLogger("gateway.http")

Handler = Callable[[Request, Gateway], Awaitable[Response]]


class Target(enum.Enum):
    """What an endpoint's path names, and so what a token's runtime patterns must cover."""

    NONE = "none"  # no runtime: operations, admin
    RUNTIME = "runtime"  # {rt}: a foreign runtime is 403
    TASK = "task"  # {task_id}: a foreign task is 404, as if it did not exist
    TASKS = "tasks"  # task ids in the body: a foreign task is that item's not_found


@dataclass(frozen=True)
class Endpoint:
    """One operation of the API: the single place that says who may call what."""

    method: str
    path: str
    handler: Handler
    # None: no bearer token. Public, or the handler authenticates (signed webhooks).
    scope: Scope | None
    target: Target = Target.NONE
    doc: docs.Doc | None = None  # required in practice: tests/unit/test_openapi.py checks


async def authorize(request: Request, gw: Gateway, endpoint: Endpoint) -> Principal | None:
    """Authenticate and check scope and runtime coverage, or raise 401/403/404."""
    if endpoint.scope is None:
        return None
    principal = await gw.auth.authenticate(request.headers.get("authorization"))
    principal.require(endpoint.scope)
    if endpoint.target is Target.RUNTIME:
        runtime_id = models.check_runtime_id(request.path_params["rt"])
        principal.require_runtime(runtime_id)
    elif endpoint.target is Target.TASK and not principal.all_runtimes:
        task_id = models.check_task_id(request.path_params["task_id"])
        if not principal.covers(await gw.store.task_runtime(task_id)):
            raise NotFound(f"no task with id {task_id}")
    return principal


def api(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The ASGI endpoint: authorization, the handler, and the error table. Unexpected
    exceptions are logged here, once, and answered 500."""

    @functools.wraps(endpoint.handler)
    async def run(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        try:
            request.state.principal = await authorize(request, gw, endpoint)
            return await endpoint.handler(request, gw)
        except Exception as exc:
            return _error_response(request, exc)

    return run


def direct_api(endpoint: Endpoint, *, keep_principal: bool) -> ASGIApp:
    """api() as a plain ASGI app, for a DirectRoute: it also sends the answer, so that a
    parked poll holds one frame fewer. `keep_principal`: put it in `request.state` for
    a handler that reads it (a batch limits itself to the token's runtimes); the claim
    does not, so none is kept for a parked poll (an object fewer)."""

    async def app(scope: ASGIScope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        gw: Gateway = request.app.state.gateway
        try:
            principal = await authorize(request, gw, endpoint)
            if keep_principal:
                request.state.principal = principal
            response = await endpoint.handler(request, gw)
        except Exception as exc:
            response = _error_response(request, exc)
        await response(scope, receive, send)

    return app


def _error_response(request: Request, exc: Exception) -> Response:
    """The error table: a GatewayError becomes its problem+json, a client that left
    before its request was read gets no real answer, anything else is logged and
    answered 500."""
    if isinstance(exc, GatewayError):
        return problem_response(exc)
    if isinstance(exc, ClientDisconnect):
        # The client left before its request was read: nobody is there to answer.
        log.debug("client left during %s %s", request.method, request.url.path)
        return Response(status_code=CLIENT_LEFT)
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return internal_error_response()


# -- producers --------------------------------------------------------------


async def enqueue(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    body = await read_json(request, gw)
    req = models.parse_enqueue(
        body,
        models.header_text(request.headers.get("idempotency-key"), "idempotency_key"),
        gw.settings.max_payload_bytes,
        gw.settings.max_json_depth,
    )
    # Sync match: a task due now may go straight to a poll parked here (claim.py).
    waiter = gw.claimer.match(runtime_id) if req.run_at is None and not req.delay_seconds else None
    leased = None
    try:
        row, created = await gw.store.enqueue(runtime_id, req, waiter.lease if waiter else None)
        if created and row.status == "claimed":
            leased = row
    except StoreUnavailable:
        if waiter is not None:
            # The task may have been written, and then given back to the queue
            # (Store.enqueue): claimable now, it needs its bump (I1).
            await gw.claimer.announce(runtime_id)
        raise
    finally:
        if waiter is not None:
            await gw.claimer.matched(runtime_id, waiter, leased)
    if not created:
        return json_response(models.render_task_or_stub(row), 200, {"Idempotent-Replayed": "true"})
    if leased is not None:
        # No task became claimable (it is leased already): no bump. The producer sees
        # the task as enqueued, as without the match.
        return json_response(models.render_task_or_stub(as_enqueued(row)), 201)
    await gw.claimer.announce(runtime_id)
    return json_response(models.render_task_or_stub(row), 201)


async def enqueue_batch(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    reqs = models.parse_batch(
        await read_json(request, gw), gw.settings.max_payload_bytes, gw.settings.max_json_depth
    )
    tasks, all_replayed = await gw.store.enqueue_batch(runtime_id, reqs)
    body = {"tasks": orjson.Fragment(tasks)}
    if all_replayed:
        return json_response(body, 200, {"Idempotent-Replayed": "true"})
    await gw.claimer.announce(runtime_id)  # one bump for the whole batch
    return json_response(body, 201)


async def cancel(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    row = await gw.store.cancel(task_id)
    await gw.results.finished([(row.id, row.status)])
    return json_response(models.render_task_or_stub(row))


async def retry(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    row = await gw.store.retry(task_id)
    await gw.claimer.announce(row.runtime_id)
    return json_response(models.render_task_or_stub(row))


# A listing page stops early, with a next_cursor, once its tasks pass this many bytes:
# 1000 tasks of 1 MiB payloads would otherwise make one answer of a gigabyte.
LIST_PAGE_BYTES = 8 * 1024 * 1024
LIST_FIRST_ROWS = 10  # read before the tasks' sizes are known; later reads follow them


async def list_tasks(request: Request, gw: Gateway) -> Response:
    """A page of tasks, oldest first: `limit` tasks, or fewer once LIST_PAGE_BYTES is
    passed. Rows are read a few at a time, so memory follows the page, not the limit."""
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    query = models.parse_list_query(request.query_params)
    page: list[orjson.Fragment] = []
    size, after, last = 0, query.after, None
    want = min(query.limit, LIST_FIRST_ROWS)
    while True:
        rows = await gw.store.list_tasks(runtime_id, query.status, want + 1, after)
        taken = 0
        for row in rows[:want]:
            task = models.task_bytes_or_stub(row)
            page.append(orjson.Fragment(task))
            size, last, taken = size + len(task), row, taken + 1
            if size >= LIST_PAGE_BYTES:
                break
        more = taken < len(rows)  # the extra row was read, or the budget cut the read
        if not more or len(page) >= query.limit or size >= LIST_PAGE_BYTES:
            break
        assert last is not None
        after = (last.created_at, last.id)
        average = max(size // len(page), 1)
        want = max(1, min(query.limit - len(page), (LIST_PAGE_BYTES - size) // average))
    cursor = models.encode_cursor(last) if more and last is not None else None
    return json_response({"tasks": page, "next_cursor": cursor})


async def stats(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    counts, oldest = await gw.store.stats(runtime_id)
    return json_response(
        {
            "runtime_id": runtime_id,
            "counts": {status: counts.get(status, 0) for status in models.STATUSES},
            "oldest_queued_age_seconds": oldest,
            "parked_pollers": gw.claimer.parked(runtime_id),
            **gw.controls.get(runtime_id).render_pause(),
        }
    )


# -- daemons ----------------------------------------------------------------


async def claim(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    # The decoded body is not kept in this frame: a parked poll would hold it for its
    # whole wait (about 0.2 KiB of its 15).
    req = models.parse_claim(
        await read_json(request, gw),
        gw.settings.max_wait_seconds,
        gw.settings.default_lease_seconds,
    )
    gone = Departure()
    watch = DisconnectWatch(request.receive, gone.set) if req.wait_seconds else None
    try:
        rows = await gw.claimer.claim(runtime_id, req, gone if watch else None)
    finally:
        if watch is not None:
            watch.stop()
    if rows and (gone.is_set() or await request.is_disconnected()):
        # The client left while its tasks were being leased: nobody would receive them.
        await gw.claimer.give_back(runtime_id, [row.task for row in rows])
        return Response(status_code=CLIENT_LEFT)
    if not rows:
        return empty_tasks_response()
    return json_response({"tasks": await _deliverable(gw, rows)})


async def _deliverable(gw: Gateway, rows: list[Leased]) -> list[orjson.Fragment]:
    """The claimed tasks as JSON. A task that cannot be shown is not left leased to
    nobody: it is ended `dead` with the reason, and the others are still delivered."""
    out = []
    for row in rows:
        task = row.task
        try:
            out.append(models.render_task(task))
        except Exception as exc:
            reason = f"the gateway could not turn this task into a response: {exc}"
            log.error("task %s of runtime %s ended dead: %s", task.id, task.runtime_id, reason)
            gw.metrics.tasks_unrenderable.inc()
            assert task.lease_id is not None  # a claimed row carries its lease
            try:
                await gw.store.bury(task.id, task.lease_id, reason)
                await gw.results.finished([(task.id, "dead")])
            except GatewayError as bury_error:
                # Its lease lapses and the janitor takes it back; at max_attempts it dies.
                log.warning("could not end task %s: %s", task.id, bury_error.detail)
    return out


async def heartbeat(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    body = await read_json(request, gw)
    lease_id = models.parse_lease_id(body)
    seconds = models.parse_lease_seconds(body, gw.settings.default_lease_seconds)
    row = await gw.store.heartbeat(task_id, lease_id, seconds)
    return json_response(models.render_task_or_stub(row))


async def complete(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    body = await read_json(request, gw)
    lease_id = models.parse_lease_id(body)
    result = models.result_json(body, gw.settings.max_payload_bytes, gw.settings.max_json_depth)
    row = await gw.completions.complete(task_id, lease_id, result)
    await gw.tasks_ended([(row.id, row.status)], [row.runtime_id])
    return json_response(models.render_task_or_stub(row))


async def fail(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    req = models.parse_fail(await read_json(request, gw))
    row = await gw.store.fail(task_id, req.lease_id, req.error, req.retry, req.retry_after_seconds)
    if row.status == "queued":
        await gw.claimer.announce(row.runtime_id)
    else:
        await gw.tasks_ended([(row.id, row.status)], [row.runtime_id])
    return json_response(models.render_task_or_stub(row))


async def release(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    lease_id = models.parse_lease_id(await read_json(request, gw))
    row = await gw.store.release(task_id, lease_id)
    if row.status == "queued":
        await gw.claimer.announce(row.runtime_id)
    else:  # a cancel was requested while it was held: now cancelled
        await gw.results.finished([(row.id, row.status)])
    return json_response(models.render_task_or_stub(row))


async def get_task(request: Request, gw: Gateway) -> Response:
    """The task; with `wait_seconds`, once it has finished or the wait ran out
    (results.py). A waiting request ends when its client leaves."""
    task_id = models.check_task_id(request.path_params["task_id"])
    wait_seconds = results.parse_wait(request.query_params, gw.settings.max_wait_seconds)
    if not wait_seconds:
        return json_response(models.render_task_or_stub(await gw.store.get(task_id)))
    gone = Departure()
    watch = DisconnectWatch(request.receive, gone.set)
    try:
        row = await gw.results.wait(task_id, wait_seconds, gone)
    finally:
        watch.stop()
    if gone.is_set():
        return Response(status_code=CLIENT_LEFT)
    return json_response(models.render_task_or_stub(row))


# -- operations -------------------------------------------------------------


async def healthz(request: Request, gw: Gateway) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request, gw: Gateway) -> Response:
    problems = await gw.readiness_problems()
    if problems:
        return json_response({"status": "not ready", "problems": problems}, 503)
    return json_response({"status": "ready"})


async def metrics(request: Request, gw: Gateway) -> Response:
    return Response(gw.metrics.render(), media_type=CONTENT_TYPE)


async def openapi_document(request: Request, gw: Gateway) -> Response:
    """The OpenAPI document, built once per app: it depends on the app's settings."""
    state = request.app.state
    if getattr(state, "openapi", None) is None:
        state.openapi = orjson.dumps(openapi.build(ENDPOINTS, gw.settings))
    return Response(state.openapi, media_type="application/json")


ENDPOINTS = [
    Endpoint(
        "POST", "/v1/runtimes/{rt}/tasks", enqueue, Scope.ENQUEUE, Target.RUNTIME, docs.ENQUEUE
    ),
    Endpoint(
        "GET", "/v1/runtimes/{rt}/tasks", list_tasks, Scope.READ, Target.RUNTIME, docs.LIST_TASKS
    ),
    Endpoint(
        "POST",
        "/v1/runtimes/{rt}/tasks:batch",
        enqueue_batch,
        Scope.ENQUEUE,
        Target.RUNTIME,
        docs.ENQUEUE_BATCH,
    ),
    Endpoint("GET", "/v1/runtimes/{rt}/stats", stats, Scope.READ, Target.RUNTIME, docs.STATS),
    Endpoint("POST", "/v1/runtimes/{rt}/claim", claim, Scope.CLAIM, Target.RUNTIME, docs.CLAIM),
    Endpoint("GET", "/v1/tasks/{task_id}", get_task, Scope.READ, Target.TASK, docs.GET_TASK),
    Endpoint(
        "POST", "/v1/tasks/{task_id}/heartbeat", heartbeat, Scope.CLAIM, Target.TASK, docs.HEARTBEAT
    ),
    Endpoint(
        "POST", "/v1/tasks/{task_id}/complete", complete, Scope.CLAIM, Target.TASK, docs.COMPLETE
    ),
    Endpoint("POST", "/v1/tasks/{task_id}/fail", fail, Scope.CLAIM, Target.TASK, docs.FAIL),
    Endpoint(
        "POST", "/v1/tasks/{task_id}/release", release, Scope.CLAIM, Target.TASK, docs.RELEASE
    ),
    # Batch lease operations: the handler checks each task's runtime (batch.py).
    Endpoint(
        "POST",
        "/v1/tasks:complete",
        batch.complete_many,
        Scope.CLAIM,
        Target.TASKS,
        docs.COMPLETE_MANY,
    ),
    Endpoint("POST", "/v1/tasks:fail", batch.fail_many, Scope.CLAIM, Target.TASKS, docs.FAIL_MANY),
    Endpoint(
        "POST",
        "/v1/tasks:heartbeat",
        batch.heartbeat_many,
        Scope.CLAIM,
        Target.TASKS,
        docs.HEARTBEAT_MANY,
    ),
    Endpoint("POST", "/v1/tasks/{task_id}/cancel", cancel, Scope.ENQUEUE, Target.TASK, docs.CANCEL),
    Endpoint("POST", "/v1/tasks/{task_id}/retry", retry, Scope.ENQUEUE, Target.TASK, docs.RETRY),
    # No bearer token: the Standard Webhooks signature authenticates (webhooks.receive).
    Endpoint(
        "POST",
        "/v1/runtimes/{rt}/webhooks",
        webhooks.receive,
        None,
        Target.RUNTIME,
        admin_docs.RECEIVE_WEBHOOK,
    ),
    Endpoint(
        "POST", "/v1/admin/tokens", admin.create_token, Scope.ADMIN, doc=admin_docs.CREATE_TOKEN
    ),
    Endpoint("GET", "/v1/admin/tokens", admin.list_tokens, Scope.ADMIN, doc=admin_docs.LIST_TOKENS),
    Endpoint(
        "DELETE",
        "/v1/admin/tokens/{token_id}",
        admin.revoke_token,
        Scope.ADMIN,
        doc=admin_docs.REVOKE_TOKEN,
    ),
    Endpoint(
        "POST",
        "/v1/admin/webhook-secrets",
        admin.create_webhook_secret,
        Scope.ADMIN,
        doc=admin_docs.CREATE_WEBHOOK_SECRET,
    ),
    Endpoint(
        "GET",
        "/v1/admin/webhook-secrets",
        admin.list_webhook_secrets,
        Scope.ADMIN,
        doc=admin_docs.LIST_WEBHOOK_SECRETS,
    ),
    Endpoint(
        "DELETE",
        "/v1/admin/webhook-secrets/{secret_id}",
        admin.revoke_webhook_secret,
        Scope.ADMIN,
        doc=admin_docs.REVOKE_WEBHOOK_SECRET,
    ),
    # The runtimes listing (the console's first page); tokens see the runtimes they cover.
    Endpoint("GET", "/v1/runtimes", runtimes.list_runtimes, Scope.READ, doc=docs.LIST_RUNTIMES),
    # Runtime controls: reading them is `read`, changing them `control`.
    Endpoint(
        "GET",
        "/v1/runtimes/{rt}/controls",
        controls_routes.get_controls,
        Scope.READ,
        Target.RUNTIME,
        docs.GET_CONTROLS,
    ),
    Endpoint(
        "PATCH",
        "/v1/runtimes/{rt}/controls",
        controls_routes.set_controls,
        Scope.CONTROL,
        Target.RUNTIME,
        docs.SET_CONTROLS,
    ),
    Endpoint(
        "POST",
        "/v1/runtimes/{rt}:pause",
        controls_routes.pause,
        Scope.CONTROL,
        Target.RUNTIME,
        docs.PAUSE,
    ),
    Endpoint(
        "POST",
        "/v1/runtimes/{rt}:resume",
        controls_routes.resume,
        Scope.CONTROL,
        Target.RUNTIME,
        docs.RESUME,
    ),
    Endpoint("GET", "/healthz", healthz, None, doc=docs.HEALTHZ),
    Endpoint("GET", "/readyz", readyz, None, doc=docs.READYZ),
    Endpoint("GET", "/metrics", metrics, None, doc=docs.METRICS),
    Endpoint("GET", "/openapi.json", openapi_document, None, doc=docs.OPENAPI),
]

# These run as DirectRoutes: the claim because every parked poll holds its frames for
# its wait, the completes because a drain sends one per task (or per claimed batch).
DIRECT = (claim, complete, batch.complete_many)
ROUTES = [
    DirectRoute(
        e.path, direct_api(e, keep_principal=e.handler is not claim), e.method, e.handler.__name__
    )
    if e.handler in DIRECT
    else Route(e.path, api(e), methods=[e.method])
    for e in ENDPOINTS
]
