"""The API's endpoint table: every operation, its handler, the scope it needs and what
its path names (`ENDPOINTS`), their authorization, and the Starlette routes made from
them (`ROUTES`). Errors become problem+json in `api()` via errors.PROBLEMS.

The handlers live in handlers/, by resource and caller: producer.py (enqueue, cancel,
retry, reads), bulk.py (a runtime's tasks retried or cancelled in bulk, its error
groups), daemon.py (claim and the single lease operations), batch.py (the batch
lease operations), controls.py, runtimes.py, history.py, webhooks.py, admin.py and
operations.py (health, readiness, metrics); the OpenAPI document's is below. They
parse, call the store and the claimer, and shape answers; they import no driver.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, cast

import orjson
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as ASGIScope

from ..admission import Priority, caller, priority
from ..api import decode
from ..api.credential_bodies import Scope
from ..auth.principals import Principal
from ..errors import GatewayError, NotFound
from ..instance import Gateway
from . import admin_docs, bulk_docs, docs, history_docs, load_docs, openapi, schedule_docs
from .handlers import (
    admin,
    batch,
    bulk,
    controls,
    history,
    load,
    operations,
    runtimes,
    schedules,
    webhooks,
)
from .handlers.daemon import claim, complete, fail, heartbeat, release
from .handlers.producer import cancel, enqueue, enqueue_batch, get_task, list_tasks, retry, stats
from .io import (
    CALLER,
    CLIENT_LEFT,
    DirectRoute,
    header_value,
    internal_error_response,
    problem_response,
)

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
    # Answered from the process's memory: it never waits for a database connection, so it
    # is never shed (the instance's load, wanted most while it sheds).
    memory_only: bool = False

    @property
    def priority(self) -> Priority:
        """Its place in the line for a database connection (gateway/admission.py). Work
        (enqueues, signed webhooks, claims, reads) waits behind the rest and is shed
        under overload. Before it: the operations on claimed tasks (complete, fail,
        heartbeat, release, one or many), which free work and keep leases alive; an
        operator's controls and administration, which must work when they are needed
        most; and the probes and metrics, which must not fail a pod that is only busy."""
        if self.memory_only:
            return Priority.RELEASE
        if self.scope in (Scope.ENQUEUE, Scope.READ):
            return Priority.WORK
        if self.scope is Scope.CLAIM:
            return Priority.WORK if self.target is Target.RUNTIME else Priority.RELEASE
        if self.scope is None and self.target is Target.RUNTIME:  # signed webhooks
            return Priority.WORK
        return Priority.RELEASE

    @property
    def refused_early(self) -> bool:
        """Whether it is refused at the door while the database's line is full, before
        its token is checked or its body read (gateway/http/shedding.py): work, except
        the claim, which an empty verdict answers without the database and whose
        refusal still applies the reports it carries (the claim pump's statements are
        admitted as they go)."""
        claim = self.scope is Scope.CLAIM and self.target is Target.RUNTIME
        return self.priority is Priority.WORK and not claim


async def authorize(request: Request, gw: Gateway, endpoint: Endpoint) -> Principal | None:
    """Authenticate and check scope and runtime coverage, or raise 401/403/404."""
    if endpoint.scope is None:
        return None
    authorization = header_value(request.scope, b"authorization")
    principal = gw.auth.known(authorization) or await gw.auth.authenticate(authorization)
    _check_scope_and_runtime(request, endpoint, principal)
    if endpoint.target is Target.TASK and not principal.all_runtimes:
        task_id = decode.check_task_id(request.path_params["task_id"])
        if not principal.covers(await gw.store.task_runtime(task_id)):
            raise NotFound(f"no task with id {task_id}")
    return principal


def authorize_at_once(
    request: Request, gw: Gateway, endpoint: Endpoint
) -> Principal | Literal[False] | None:
    """`authorize` when it needs no I/O: the same principal or the same error. False
    when it does (an issued token this process has not cached, or a task whose runtime
    must be read): then await `authorize`. Every claim comes here first."""
    if endpoint.scope is None:
        return None
    principal = gw.auth.known(header_value(request.scope, b"authorization"))
    if principal is None or (endpoint.target is Target.TASK and not principal.all_runtimes):
        return False
    _check_scope_and_runtime(request, endpoint, principal)
    return principal


def _check_scope_and_runtime(request: Request, endpoint: Endpoint, principal: Principal) -> None:
    assert endpoint.scope is not None
    principal.require(endpoint.scope)
    if endpoint.target is Target.RUNTIME:
        runtime_id = decode.check_runtime_id(request.path_params["rt"])
        principal.require_runtime(runtime_id)


def api(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The ASGI endpoint: authorization, the handler, and the error table. Unexpected
    exceptions are logged here, once, and answered 500."""

    wanted = endpoint.priority
    work = wanted is Priority.WORK

    @functools.wraps(endpoint.handler)
    async def run(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        priority.set(wanted)  # each request runs in a task (and a context) of its own
        if work:  # its connection: work whose client has left is not started
            caller.set(request.scope.get(CALLER))
        try:
            request.state.principal = await authorize(request, gw, endpoint)
            return await endpoint.handler(request, gw)
        except Exception as exc:
            return _error_response(request, exc)

    return run


# The claim's handler, which is handed the caller's principal (see direct_api).
ClaimHandler = Callable[[Request, Gateway, Principal | None], Awaitable[Response]]


def direct_api(endpoint: Endpoint, *, keep_principal: bool) -> ASGIApp:
    """api() as a plain ASGI app, for a DirectRoute: it also sends the answer, so that a
    parked poll holds one frame fewer. `keep_principal`: put it in `request.state` for
    a handler that reads it (a batch limits itself to the token's runtimes); else the
    handler is the claim, which is handed it as an argument (its acknowledgements are
    limited to the token's runtimes): this frame holds it anyway, while request.state
    would cost each parked poll an object more."""
    claim_handler = None if keep_principal else cast(ClaimHandler, endpoint.handler)
    wanted = endpoint.priority

    async def app(scope: ASGIScope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        # app.GatewayApp's attribute, else (another app) its state's.
        gw: Gateway = getattr(scope["app"], "gateway", None) or request.app.state.gateway
        priority.set(wanted)  # each request runs in a task (and a context) of its own
        try:
            principal = authorize_at_once(request, gw, endpoint)
            if principal is False:
                principal = await authorize(request, gw, endpoint)
            if claim_handler is not None:
                response = await claim_handler(request, gw, principal)
            else:
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


# -- operations -------------------------------------------------------------


async def openapi_document(request: Request, gw: Gateway) -> Response:
    """The OpenAPI document, built once per app: it depends on the app's settings."""
    state = request.app.state
    if getattr(state, "openapi", None) is None:
        state.openapi = orjson.dumps(openapi.build(ENDPOINTS, gw.settings))
    return Response(state.openapi, media_type="application/json")


_SCHEDULE = "/v1/runtimes/{rt}/schedules/{name}"

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
    # A runtime's tasks in bulk, each as the single retry or cancel; its error groups.
    *(
        Endpoint(method, "/v1/runtimes/{rt}" + path, handler, scope, Target.RUNTIME, doc)
        for method, path, handler, scope, doc in (
            ("POST", "/tasks:retry", bulk.retry_tasks, Scope.ENQUEUE, bulk_docs.RETRY_TASKS),
            ("POST", "/tasks:cancel", bulk.cancel_tasks, Scope.ENQUEUE, bulk_docs.CANCEL_TASKS),
            ("GET", "/errors", bulk.error_groups, Scope.READ, bulk_docs.ERROR_GROUPS),
        )
    ),
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
    # The per-runtime history; the fleet's covers the runtimes the token covers.
    Endpoint(
        "GET",
        "/v1/runtimes/{rt}/history",
        history.runtime_history,
        Scope.READ,
        Target.RUNTIME,
        history_docs.RUNTIME_HISTORY,
    ),
    Endpoint(
        "GET", "/v1/history", history.fleet_history, Scope.READ, doc=history_docs.FLEET_HISTORY
    ),
    # Runtime controls: reading them is `read`, changing them `control`.
    Endpoint(
        "GET",
        "/v1/runtimes/{rt}/controls",
        controls.get_controls,
        Scope.READ,
        Target.RUNTIME,
        docs.GET_CONTROLS,
    ),
    Endpoint(
        "PATCH",
        "/v1/runtimes/{rt}/controls",
        controls.set_controls,
        Scope.CONTROL,
        Target.RUNTIME,
        docs.SET_CONTROLS,
    ),
    Endpoint(
        "POST",
        "/v1/runtimes/{rt}:pause",
        controls.pause,
        Scope.CONTROL,
        Target.RUNTIME,
        docs.PAUSE,
    ),
    Endpoint(
        "POST",
        "/v1/runtimes/{rt}:resume",
        controls.resume,
        Scope.CONTROL,
        Target.RUNTIME,
        docs.RESUME,
    ),
    # The answering instance's load (the console's load panel); memory only.
    Endpoint(
        "GET",
        "/v1/instance/load",
        load.instance_load,
        Scope.READ,
        doc=load_docs.INSTANCE_LOAD,
        memory_only=True,
    ),
    # Schedules: managing them is `enqueue` on the runtime, reading them `read`.
    Endpoint(
        "GET",
        "/v1/runtimes/{rt}/schedules",
        schedules.list_schedules,
        Scope.READ,
        Target.RUNTIME,
        schedule_docs.LIST_SCHEDULES,
    ),
    Endpoint(
        "PUT",
        _SCHEDULE,
        schedules.put_schedule,
        Scope.ENQUEUE,
        Target.RUNTIME,
        schedule_docs.PUT_SCHEDULE,
    ),
    Endpoint(
        "GET",
        _SCHEDULE,
        schedules.get_schedule,
        Scope.READ,
        Target.RUNTIME,
        schedule_docs.GET_SCHEDULE,
    ),
    Endpoint(
        "DELETE",
        _SCHEDULE,
        schedules.delete_schedule,
        Scope.ENQUEUE,
        Target.RUNTIME,
        schedule_docs.DELETE_SCHEDULE,
    ),
    Endpoint(
        "POST",
        _SCHEDULE + ":trigger",
        schedules.trigger_schedule,
        Scope.ENQUEUE,
        Target.RUNTIME,
        schedule_docs.TRIGGER_SCHEDULE,
    ),
    Endpoint(
        "POST",
        _SCHEDULE + ":pause",
        schedules.pause_schedule,
        Scope.ENQUEUE,
        Target.RUNTIME,
        schedule_docs.PAUSE_SCHEDULE,
    ),
    Endpoint(
        "POST",
        _SCHEDULE + ":resume",
        schedules.resume_schedule,
        Scope.ENQUEUE,
        Target.RUNTIME,
        schedule_docs.RESUME_SCHEDULE,
    ),
    Endpoint(
        "POST",
        _SCHEDULE + ":backfill",
        schedules.backfill_schedule,
        Scope.ENQUEUE,
        Target.RUNTIME,
        schedule_docs.BACKFILL_SCHEDULE,
    ),
    Endpoint("GET", "/healthz", operations.healthz, None, doc=docs.HEALTHZ),
    Endpoint("GET", "/readyz", operations.readyz, None, doc=docs.READYZ),
    Endpoint("GET", "/metrics", operations.metrics, None, doc=docs.METRICS),
    Endpoint("GET", "/openapi.json", openapi_document, None, doc=docs.OPENAPI),
]

# These run as DirectRoutes: the claim because every parked poll holds its frames for
# its wait, the completes because a drain sends one per task (or per claimed batch).
DIRECT = (claim, complete, batch.complete_many)


class ScheduleName(Convertor[str]):
    """A schedule's name in a path: a segment that does not end in one of the schedule
    actions (`:trigger`, ...), so that `PUT …/x:trigger` is the action's path with a
    method it lacks (405), never a PUT of a schedule named `x:trigger`. Another name with
    a `:` reaches the handler, which refuses it naming the field (422)."""

    regex = "(?:[^/:]+|[^/]*:(?!(?:trigger|pause|resume|backfill)$)[^/]*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("schedule_name", ScheduleName())


def _route_path(path: str) -> str:
    """An endpoint's path as its Starlette route matches it (the documented path names
    its parameters plainly)."""
    return path.replace("{name}", "{name:schedule_name}")


ROUTES = [
    DirectRoute(
        e.path, direct_api(e, keep_principal=e.handler is not claim), e.method, e.handler.__name__
    )
    if e.handler in DIRECT
    else Route(_route_path(e.path), api(e), methods=[e.method])
    for e in ENDPOINTS
]
