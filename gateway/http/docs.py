"""Each operation's documentation: summary, description, replies and errors.

Replies name their body's schema in answers.SCHEMAS (admin answers: admin_docs.SCHEMAS; the
instance's load: load_docs.SCHEMAS);
request bodies come from the field specs in bodies.py. Each Endpoint in routes.py
carries one of the `Doc`s below; openapi.py turns them into the OpenAPI document, and
TAGS describes the groups they are listed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api import bodies
from ..api.bodies import (
    CONTROLS_BODY,
    PATTERN_WALK,
    PAUSE_BODY,
    RUNTIMES_MAX_LIMIT,
    RUNTIMES_QUERY,
    WAIT_QUERY,
)
from ..api.fields import Body, Field, RawBody
from ..claim.controls import REFRESH_SECONDS
from ..errors import Conflict, Draining, GatewayError, IdempotencyKeyReused, LeaseLost, Overloaded


@dataclass(frozen=True)
class Param:
    """A path parameter or a response header."""

    name: str
    description: str
    schema: Mapping[str, Any]
    required: bool = False


@dataclass(frozen=True)
class Link:
    """An OpenAPI link: an operation this answer's values can be passed to (a task's id,
    a lease), so that a client or a fuzzer can follow the task's life."""

    name: str
    operation_id: str
    parameters: Mapping[str, str]  # parameter -> runtime expression
    request_body: Mapping[str, str] | None = None  # body field -> runtime expression


@dataclass(frozen=True)
class Reply:
    """A success answer (or any answer that is not problem+json)."""

    status: int
    description: str
    # A schema's name (answers.SCHEMAS, admin_docs.SCHEMAS, load_docs.SCHEMAS), a JSON
    # Schema, or no body.
    schema: str | Mapping[str, Any] | None
    media_type: str = "application/json"
    headers: tuple[Param, ...] = ()
    links: tuple[Link, ...] = ()


@dataclass(frozen=True)
class Doc:
    """An operation's documentation. The error answers are derived from the endpoint
    (authentication, path, body) plus `errors`, the ones its handler raises itself."""

    operation_id: str
    summary: str
    replies: tuple[Reply, ...]
    description: str = ""
    tag: str = "operations"
    body: Body | RawBody | None = None
    query: Body | None = None
    headers: tuple[Field, ...] = ()  # request headers
    path_params: tuple[Param, ...] = ()  # beyond the shared ones, see openapi.PATH_PARAMS
    errors: tuple[type[GatewayError], ...] = ()


# The document's tags: each operation's `tag`, with what it groups.
TAGS = {
    "producers": "Enqueue tasks, and follow them: read, wait for, list, count, cancel and "
    "retry them. Signed webhook deliveries enqueue too.",
    "daemons": "Claim tasks, waiting for work when there is none, and report each under its "
    "lease: heartbeat, complete, fail or release, one task or many at once.",
    "controls": "Pause, resume and limit a runtime's claims, over every gateway instance.",
    "schedules": "Recurring tasks per runtime: cron or a fixed interval, with overlap and "
    "catch-up policies, time zones, trigger, pause and backfill; one task per tick.",
    "admin": "Scoped API tokens and webhook signing secrets; the `admin` scope only.",
    "operations": "Liveness, readiness, metrics and this document, with no authentication; "
    "the answering instance's load, with a `read` token.",
}

# -- operations ---------------------------------------------------------------------------

TASK = "Task"
REPLAYED = Param(
    "Idempotent-Replayed",
    "`true`: the idempotency key was seen with this same request; nothing new was stored.",
    {"type": "string", "const": "true"},
    required=True,
)

PREFERENCE_APPLIED = Param(
    "Preference-Applied",
    "`return=minimal`: the request's `Prefer: return=minimal` was honoured, and the "
    "answer holds task ids only. Absent when whole tasks are answered.",
    {"type": "string", "const": "return=minimal"},
)
# An enqueue's answer: whole tasks, or with `Prefer: return=minimal` their ids only.
ENQUEUED = "EnqueuedTask"
ENQUEUED_LIST = "EnqueuedTasks"


def _task_links(task: str) -> tuple[Link, ...]:
    """What can be done with the task at JSON pointer `task` of an answer."""
    task_id = {"task_id": f"$response.body#{task}/id"}
    return (
        Link("GetTask", "getTask", task_id),
        Link("CancelTask", "cancelTask", task_id),
    )


def _lease_links(task: str) -> tuple[Link, ...]:
    """The lease operations on the claimed task at JSON pointer `task` of an answer."""
    task_id = {"task_id": f"$response.body#{task}/id"}
    lease = {"lease_id": f"$response.body#{task}/lease_id"}
    return tuple(
        Link(name, operation_id, task_id, lease)
        for name, operation_id in (
            ("CompleteTask", "completeTask"),
            ("HeartbeatTask", "heartbeatTask"),
            ("FailTask", "failTask"),
            ("ReleaseTask", "releaseTask"),
        )
    )


ENQUEUE = Doc(
    "enqueueTask",
    "Enqueue a task",
    (
        Reply(
            201,
            "Stored; a waiting daemon is woken. The task, or with `Prefer: return=minimal` "
            "its id only.",
            ENQUEUED,
            headers=(PREFERENCE_APPLIED,),
            links=_task_links(""),
        ),
        Reply(
            200,
            "A repeated idempotency key with the same request: the task already stored (or "
            "its id).",
            ENQUEUED,
            headers=(REPLAYED, PREFERENCE_APPLIED),
            links=_task_links(""),
        ),
    ),
    "The key may come in the body or the Idempotency-Key header; reusing it with "
    "another request is `422 idempotency_key_reused`. With `Prefer: return=minimal` the "
    'answer is `{"id": ...}` alone; everything else (statuses, headers, errors) is the '
    "same.",
    tag="producers",
    body=bodies.ENQUEUE_BODY,
    headers=(bodies.IDEMPOTENCY_KEY_HEADER, bodies.PREFER_HEADER, *bodies.TRACE_HEADERS),
    errors=(IdempotencyKeyReused,),
)
ENQUEUE_BATCH = Doc(
    "enqueueTasks",
    "Enqueue a batch of tasks, all or nothing",
    (
        Reply(
            201,
            "Stored, in request order: whole tasks, or with `Prefer: return=minimal` "
            '`{"id": ...}` each.',
            ENQUEUED_LIST,
            headers=(PREFERENCE_APPLIED,),
        ),
        Reply(
            200,
            "Every item was an idempotent replay.",
            ENQUEUED_LIST,
            headers=(REPLAYED, PREFERENCE_APPLIED),
        ),
    ),
    "One bad item is `422` naming `tasks[i]` (`field` and `index`), and nothing is stored. "
    'With `Prefer: return=minimal` each task is answered as `{"id": ...}` alone (a '
    "replayed item's is the id of the task its key made), which spares the gateway and "
    "the client a batch's payloads; everything else (statuses, headers, errors) is the "
    "same.",
    tag="producers",
    body=bodies.BATCH_BODY,
    headers=(bodies.PREFER_HEADER, *bodies.TRACE_HEADERS),
    errors=(IdempotencyKeyReused,),
)
LIST_TASKS = Doc(
    "listTasks",
    "List a runtime's tasks, oldest first",
    (Reply(200, "A page; next_cursor is null on the last one.", "TaskPage"),),
    tag="producers",
    query=bodies.LIST_QUERY,
)
STATS = Doc(
    "runtimeStats",
    "Count a runtime's tasks by status",
    (Reply(200, "Counts for every status.", "Stats"),),
    tag="producers",
)
CANCEL = Doc(
    "cancelTask",
    "Cancel a task",
    (
        Reply(
            200,
            "Queued: now cancelled. Claimed: cancel_requested until reported.",
            TASK,
            links=(Link("RetryTask", "retryTask", {"task_id": "$response.body#/id"}),),
        ),
    ),
    "Cancelling a cancelled task answers it again; a finished one is `409 invalid_state`.",
    tag="producers",
    errors=(Conflict,),
)
RETRY = Doc(
    "retryTask",
    "Queue a dead, expired or cancelled task again",
    (Reply(200, "Queued at once, attempts reset.", TASK),),
    tag="producers",
    errors=(Conflict,),
)
GET_TASK = Doc(
    "getTask",
    "Get a task, or wait for it to finish",
    (
        Reply(
            200, "The task; with wait_seconds, finished or as it was when the wait ran out.", TASK
        ),
    ),
    "With `wait_seconds`, an unfinished task is answered once it finishes (completed, dead, "
    "expired or cancelled) or when the wait runs out, whichever comes first: `200` either "
    "way, and the task's `status` tells which. A shutting-down instance answers at once. "
    "Waits count against the instance's bound on waiting requests (GATEWAY_MAX_PARKED_POLLS): "
    "beyond it, `429` with Retry-After.",
    tag="producers",
    query=WAIT_QUERY,
    errors=(Overloaded,),
)
CLAIM = Doc(
    "claimTasks",
    "Claim tasks, waiting for work if there is none",
    (
        Reply(
            200,
            "Leased tasks; empty when the wait ran out.",
            "ClaimedTaskList",
            links=_lease_links("/tasks/0"),
        ),
    ),
    "Overloaded is `429` with Retry-After; a shutting-down instance is `503 draining`. "
    "A claim may carry the previous tasks' reports (`complete`, `fail`: each item as in "
    "`POST /v1/tasks:complete` and `POST /v1/tasks:fail`, at most "
    f"{bodies.MAX_LEASE_BATCH} together, each task once): they are committed before the "
    "claim waits (completes alone in the statement that leases its tasks, one commit "
    "for both), and answered in `acks`, completes first, whatever "
    "becomes of the claim. A refused claim then answers `200` with no tasks, its `acks` "
    "and `retry_after_seconds` instead of its error; so does one whose runtime is paused "
    "or at a limit. Only a database that cannot apply them answers `503`, and then none "
    "is applied.",
    tag="daemons",
    body=bodies.CLAIM_BODY,
    errors=(Overloaded, Draining),
)
_LEASE_LOST = "A lease that is no longer the task's current one is `409 lease_lost`."
HEARTBEAT = Doc(
    "heartbeatTask",
    "Extend a lease",
    (Reply(200, "The task; cancel_requested says whether to stop.", TASK),),
    _LEASE_LOST,
    tag="daemons",
    body=bodies.HEARTBEAT_BODY,
    errors=(LeaseLost,),
)
COMPLETE = Doc(
    "completeTask",
    "Report a task done",
    (Reply(200, "The finished task; repeating it with the same lease answers it again.", TASK),),
    _LEASE_LOST,
    tag="daemons",
    body=bodies.COMPLETE_BODY,
    errors=(LeaseLost,),
)
FAIL = Doc(
    "failTask",
    "Report a task failed",
    (Reply(200, "Queued again after a backoff, or dead at max_attempts.", TASK),),
    _LEASE_LOST,
    tag="daemons",
    body=bodies.FAIL_BODY,
    errors=(LeaseLost,),
)
RELEASE = Doc(
    "releaseTask",
    "Give a task back",
    (Reply(200, "Queued again at once.", TASK),),
    _LEASE_LOST,
    tag="daemons",
    body=bodies.RELEASE_BODY,
    errors=(LeaseLost,),
)
HEALTHZ = Doc("healthz", "Liveness", (Reply(200, "The process answers.", "Health"),))
READYZ = Doc(
    "readyz",
    "Readiness",
    (
        Reply(
            200,
            "Serving: started, not shutting down, and the schema current when Postgres "
            "answers. While Postgres does not answer it stays ready, saying so in "
            "`degraded`.",
            "Ready",
        ),
        Reply(503, "Not ready; the problems name the components.", "NotReady"),
    ),
)
METRICS = Doc(
    "metrics",
    "Prometheus metrics",
    (Reply(200, "The Prometheus text format.", {"type": "string"}, "text/plain"),),
)
OPENAPI = Doc(
    "openapi",
    "This document",
    (Reply(200, "OpenAPI 3.1.", "OpenAPIDocument"),),
)

# -- batch lease operations (gateway/http/handlers/batch.py) --
_BATCH = (
    "Each item is what the single operation does with its task; one item's problem "
    "(`lease_lost`, `not_found`: the problem the single operation answers, in the item) "
    "never undoes another's success. A task of a runtime the token does not cover is "
    "`not_found`. A request with no items, more than 1000, a malformed item or a task "
    "named twice is `422` naming `tasks[i]` (`field` and `index`), and nothing is stored."
)
COMPLETE_MANY = Doc(
    "completeTasks",
    "Report several tasks done",
    (Reply(200, "One result per item, in request order.", "CompleteManyResults"),),
    _BATCH + " Repeating an item with the same lease answers `completed` again.",
    tag="daemons",
    body=bodies.COMPLETE_MANY_BODY,
)
FAIL_MANY = Doc(
    "failTasks",
    "Report several tasks failed",
    (Reply(200, "One result per item, in request order.", "FailManyResults"),),
    _BATCH + " Tasks queued again wake waiting daemons of their runtimes.",
    tag="daemons",
    body=bodies.FAIL_MANY_BODY,
)
HEARTBEAT_MANY = Doc(
    "heartbeatTasks",
    "Extend several leases",
    (Reply(200, "One result per item, in request order.", "HeartbeatManyResults"),),
    _BATCH,
    tag="daemons",
    body=bodies.HEARTBEAT_MANY_BODY,
)

# -- the runtimes listing (gateway/http/handlers/runtimes.py) -----------------------------

LIST_RUNTIMES = Doc(
    "listRuntimes",
    "List the runtimes that have live tasks, with their counts",
    (
        Reply(
            200, "A page in runtime id order; next_cursor is null on the last one.", "RuntimePage"
        ),
    ),
    "Lists every runtime holding tasks (queued, due or not yet due; claimed; or finished and "
    "not yet removed by retention) or with controls set, in runtime id order, at most "
    f"`limit` ({RUNTIMES_MAX_LIMIT} at most) per page. A token limited to runtime patterns "
    f"sees only the runtimes they cover: each page looks at {PATTERN_WALK} runtimes at "
    "most, so its page may hold fewer than `limit`, even none, with a next_cursor to go on "
    "from. A next_cursor is opaque and only good for the token it was given to: any other "
    "cursor, or one made before the server's admin token changed, is `422` naming `cursor` "
    "(list again from the first page).",
    tag="producers",
    query=RUNTIMES_QUERY,
)


# -- runtime controls (gateway/claim/controls.py) ------------------------------------------------

_CONTROLS_ABOUT = (
    "A runtime never changed has no controls: not paused, no limits, updated_at null. "
    "Every instance learns of a change within its pub/sub latency (at most "
    f"{REFRESH_SECONDS:g} s when a message is lost). Needs the `control` scope (or admin); a "
    "token limited to runtime patterns controls only the runtimes they cover."
)
GET_CONTROLS = Doc(
    "getRuntimeControls",
    "Get a runtime's controls (pause, max_in_flight, claims_per_second)",
    (Reply(200, "The runtime's controls.", "Controls"),),
    _CONTROLS_ABOUT,
    tag="controls",
)
SET_CONTROLS = Doc(
    "setRuntimeControls",
    "Change a runtime's controls",
    (Reply(200, "The runtime's controls after the change.", "Controls"),),
    "Fields left out keep their value; null removes a limit. " + _CONTROLS_ABOUT,
    tag="controls",
    body=CONTROLS_BODY,
)
PAUSE = Doc(
    "pauseRuntime",
    "Pause a runtime: claims hand out nothing, enqueues still work",
    (Reply(200, "The runtime's controls, paused.", "Controls"),),
    "Parked claims stay parked and are answered once the runtime is resumed and has work; "
    "a claim without wait_seconds answers an empty list at once. The body is optional: "
    "`reason` is shown with the controls, stats and in the console; with `until` the pause "
    "ends by itself at that time on every instance, and parked claims are woken then. "
    "Pausing a paused runtime replaces its reason and end and keeps paused_since. "
    + _CONTROLS_ABOUT,
    tag="controls",
    body=PAUSE_BODY,
)
RESUME = Doc(
    "resumeRuntime",
    "Resume a paused runtime",
    (Reply(200, "The runtime's controls, not paused.", "Controls"),),
    "Parked claims are woken and served. Idempotent. " + _CONTROLS_ABOUT,
    tag="controls",
)
