"""The request bodies and query of the API, each declared once (see fields.py): the
parsers in requests.py read them, and the OpenAPI document describes them, from these
specs."""

from __future__ import annotations

from .fields import Body, Field, Kind, Setting

MAX_WORKER_ID = 200
MAX_IDEMPOTENCY_KEY = 200
# A signed webhook delivery's idempotency key is this plus its webhook-id. Producers'
# keys live beside them on a runtime, so a producer may not make one: it could take a
# delivery's key before the delivery arrives, and the delivery would be refused.
WEBHOOK_KEY_PREFIX = "webhook:"
MAX_ERROR_CHARS = 10_000
PAYLOAD_BYTES = Setting("max_payload_bytes")
JSON_DEPTH = Setting("max_json_depth")
MAX_DELAY_SECONDS = 365 * 86400
MAX_BATCH = 1000
STATUSES = ("queued", "claimed", "completed", "dead", "expired", "cancelled")

IDEMPOTENCY_KEY_HEADER = Field(
    "Idempotency-Key",
    Kind.STRING,
    "The idempotency_key, as a header; if both are given they must be equal.",
    max_length=MAX_IDEMPOTENCY_KEY,
)
TRACEPARENT_HEADER = Field(
    "traceparent",
    Kind.TEXT,
    "W3C Trace Context: stored with every task the request enqueues (a batch item's own "
    "`trace` wins) and given back with it. Malformed, it is ignored.",
)
TRACESTATE_HEADER = Field(
    "tracestate",
    Kind.TEXT,
    "W3C Trace Context vendor entries, kept with the traceparent; ignored without one.",
)
TRACE_HEADERS = (TRACEPARENT_HEADER, TRACESTATE_HEADER)
PREFER_HEADER = Field(
    "Prefer",
    Kind.TEXT,
    "RFC 7240 preferences. `return=minimal` answers each new (or replayed) task as "
    'its id only, `{"id": ...}`, and the answer carries `Preference-Applied: '
    "return=minimal`; `return=representation`, or no `return`, answers whole tasks. "
    "Several preferences may be given, separated by commas "
    "(`respond-async, return=minimal`); names and values are read without regard to case, "
    "and preferences the gateway does not know are ignored.",
)
ENQUEUE_BODY = Body(
    "EnqueueRequest",
    "A task for the runtime named in the path.",
    (
        Field(
            "payload",
            Kind.JSON,
            "The work, any JSON value (null included); a daemon receives it exactly as "
            "sent, numbers included.",
            required=True,
            max_bytes=PAYLOAD_BYTES,
            max_depth=JSON_DEPTH,
            hint="any JSON value",
        ),
        Field(
            "priority",
            Kind.INTEGER,
            "Higher is claimed first; first in, first out within a priority.",
            default=50,
            minimum=0,
            maximum=1000,
        ),
        Field(
            "idempotency_key",
            Kind.STRING,
            "Names the request: repeating it with the same key and the same request "
            "answers the task already stored; with another request it is refused. "
            f"Keys starting with `{WEBHOOK_KEY_PREFIX}` are kept for signed webhook "
            "deliveries and refused here.",
            max_length=MAX_IDEMPOTENCY_KEY,
        ),
        Field(
            "delay_seconds",
            Kind.NUMBER,
            "Not claimable before this many seconds from now. Not with run_at.",
            minimum=0,
            maximum=MAX_DELAY_SECONDS,
        ),
        Field(
            "run_at",
            Kind.TIME,
            "Not claimable before this time (RFC 3339 with a zone, years 1970 to 9000). "
            "Not with delay_seconds.",
        ),
        Field(
            "ttl_seconds",
            Kind.NUMBER,
            "Expires if not claimed within this many seconds from when it becomes claimable.",
            minimum=1,
            maximum=MAX_DELAY_SECONDS,
        ),
        Field(
            "max_attempts",
            Kind.INTEGER,
            "Claims allowed; a failed or lapsed task at this many attempts ends dead.",
            default=5,
            minimum=1,
            maximum=100,
        ),
        Field(
            "trace",
            Kind.TRACE,
            "The task's trace context, stored with it and given to whoever claims it. "
            "The request's traceparent and tracestate headers say the same for every "
            "task it enqueues; this wins over them. Malformed, it is ignored. Not part of "
            "the request an idempotency key names.",
        ),
    ),
    exclusive=(("delay_seconds", "run_at"),),
    example={"payload": {"invoice": 1042}, "priority": 60, "idempotency_key": "invoice-1042"},
)
BATCH_BODY = Body(
    "EnqueueBatchRequest",
    "Tasks stored all or nothing; a bad item fails the batch, naming tasks[i].",
    (
        Field(
            "tasks",
            Kind.ARRAY,
            "The tasks, each as for a single enqueue.",
            required=True,
            min_items=1,
            max_items=MAX_BATCH,
            items=ENQUEUE_BODY,
            hint="tasks",
        ),
    ),
    example={"tasks": [{"payload": {"invoice": 1043}}, {"payload": {"invoice": 1044}}]},
)
LEASE_ID = Field(
    "lease_id",
    Kind.UUID,
    "The lease_id the claim returned.",
    required=True,
    max_length=64,
    hint="the lease_id a claim returned",
)
LEASE_SECONDS = Field(
    "lease_seconds",
    Kind.INTEGER,
    "The lease runs out this many seconds from now.",
    default=Setting("default_lease_seconds"),
    minimum=1,
    maximum=3600,
)
HEARTBEAT_BODY = Body(
    "HeartbeatRequest",
    "Extends a lease.",
    (LEASE_ID, LEASE_SECONDS),
    example={"lease_id": "6a1d3c52-8f0e-4b7a-9c21-3e5f7d9b1a40", "lease_seconds": 120},
)
COMPLETE_BODY = Body(
    "CompleteRequest",
    "Reports a task done.",
    (
        LEASE_ID,
        Field(
            "result",
            Kind.JSON,
            "What the task produced, any JSON value; null or absent: none.",
            max_bytes=PAYLOAD_BYTES,
            max_depth=JSON_DEPTH,
        ),
    ),
    example={"lease_id": "6a1d3c52-8f0e-4b7a-9c21-3e5f7d9b1a40", "result": {"sent": True}},
)
FAIL_BODY = Body(
    "FailRequest",
    "Reports a task failed.",
    (
        LEASE_ID,
        Field(
            "error",
            Kind.TEXT,
            f"What went wrong; kept up to {MAX_ERROR_CHARS} characters.",
            required=True,
            hint="a string describing the failure",
        ),
        Field(
            "retry",
            Kind.BOOLEAN,
            "Queue the task again (after an exponential backoff with jitter) unless it "
            "has reached max_attempts; false ends it dead.",
            default=True,
        ),
        Field(
            "retry_after_seconds",
            Kind.NUMBER,
            "Wait this long before the retry instead of the backoff.",
            minimum=0,
            maximum=7 * 86400,
        ),
    ),
    example={
        "lease_id": "6a1d3c52-8f0e-4b7a-9c21-3e5f7d9b1a40",
        "error": "the mail server refused the message",
    },
)
RELEASE_BODY = Body(
    "ReleaseRequest",
    "Gives a task back, queued again at once.",
    (LEASE_ID,),
    example={"lease_id": "6a1d3c52-8f0e-4b7a-9c21-3e5f7d9b1a40"},
)
LIST_QUERY = Body(
    "ListQuery",
    "A page of a runtime's tasks, oldest first.",
    (
        Field(
            "status",
            Kind.STRING,
            "Only tasks in this status.",
            enum=STATUSES,
            enum_name="TaskStatus",
        ),
        Field("limit", Kind.INTEGER, "Tasks per page.", default=100, minimum=1, maximum=1000),
        Field("cursor", Kind.STRING, "The next_cursor of the previous page."),
        Field(
            "schedule",
            Kind.STRING,
            "Only the tasks this schedule made (by its name).",
            max_length=64,
        ),
    ),
)

# -- batch lease operations (gateway/http/handlers/batch.py) --

MAX_LEASE_BATCH = 1000
TASK_ID = Field(
    "id",
    Kind.UUID,
    "The task's id.",
    required=True,
    max_length=64,
    hint="the id of a task",
)


def _lease_batch(name: str, description: str, item: Body) -> Body:
    """A batch body: `tasks`, each item the single operation's body plus the task's id."""
    return Body(
        name,
        description,
        (
            Field(
                "tasks",
                Kind.ARRAY,
                "One item per task, each task at most once; answered in this order.",
                required=True,
                min_items=1,
                max_items=MAX_LEASE_BATCH,
                items=Body(item.name + "Item", item.description, (TASK_ID, *item.fields)),
                hint="tasks",
            ),
        ),
    )


COMPLETE_MANY_BODY = _lease_batch(
    "CompleteManyRequest", "Reports several tasks done, each as a single complete.", COMPLETE_BODY
)
FAIL_MANY_BODY = _lease_batch(
    "FailManyRequest", "Reports several tasks failed, each as a single fail.", FAIL_BODY
)
HEARTBEAT_MANY_BODY = _lease_batch(
    "HeartbeatManyRequest", "Extends several leases, each as a single heartbeat.", HEARTBEAT_BODY
)


# The claim comes after the batch bodies: the acknowledgements it may carry are their items.
CLAIM_BODY = Body(
    "ClaimRequest",
    "A daemon asking for work, waiting for it if there is none yet.",
    (
        Field(
            "worker_id",
            Kind.STRING,
            "Who claims: shown on the task while it holds the lease.",
            required=True,
            max_length=MAX_WORKER_ID,
        ),
        Field(
            "max_tasks", Kind.INTEGER, "Tasks to claim at most.", default=1, minimum=1, maximum=100
        ),
        Field(
            "wait_seconds",
            Kind.NUMBER,
            "How long to wait for work when there is none; 0 answers at once.",
            default=0.0,
            minimum=0,
            maximum=Setting("max_wait_seconds"),
        ),
        LEASE_SECONDS,
        Field(
            "complete",
            Kind.ARRAY,
            "Tasks to report done before claiming, each item as in `POST /v1/tasks:complete`; "
            f"with `fail`, at most {MAX_LEASE_BATCH} items together. Applied and committed "
            "before the claim: the answer's `acks` says what became of each.",
            min_items=0,
            max_items=MAX_LEASE_BATCH,
            items=COMPLETE_MANY_BODY["tasks"].items,
            hint="tasks to report done",
        ),
        Field(
            "fail",
            Kind.ARRAY,
            "Tasks to report failed before claiming, each item as in `POST /v1/tasks:fail`; "
            f"with `complete`, at most {MAX_LEASE_BATCH} items together.",
            min_items=0,
            max_items=MAX_LEASE_BATCH,
            items=FAIL_MANY_BODY["tasks"].items,
            hint="tasks to report failed",
        ),
    ),
    example={"worker_id": "billing-worker-1", "max_tasks": 10},
)


MAX_IN_FLIGHT = 100_000


MAX_CLAIMS_PER_SECOND = 100_000.0


# The slowest rate, one task in 1,000 s. Far below it, Postgres's float8 underflows
# when the bucket refills (rate times elapsed seconds, 5e-324 at the extreme), and
# every claim on the runtime would fail.
MIN_CLAIMS_PER_SECOND = 0.001


MAX_PAUSE_REASON = 500  # characters


PAUSE_BODY = Body(
    "Pause",
    "Why the runtime is paused and until when; both optional, and so is the body.",
    (
        Field(
            "reason",
            Kind.STRING,
            "Why the runtime is paused, shown with its controls, stats and in the console.",
            max_length=MAX_PAUSE_REASON,
        ),
        Field(
            "until",
            Kind.TIME,
            "When the pause ends by itself (RFC 3339 with a zone, in the future); "
            "left out: until resumed.",
        ),
    ),
    closed=True,
    example={"reason": "database migration"},
)


CONTROLS_BODY = Body(
    "RuntimeControls",
    "The runtime's controls to change. A field left out keeps its value; null removes a limit.",
    (
        Field("paused", Kind.BOOLEAN, "While true, claims hand out nothing; enqueues work."),
        Field(
            "max_in_flight",
            Kind.INTEGER,
            "At most this many of the runtime's tasks leased at once, over every gateway "
            "instance; null: no limit.",
            minimum=1,
            maximum=MAX_IN_FLIGHT,
        ),
        Field(
            "claims_per_second",
            Kind.NUMBER,
            "At most this many tasks leased per second (a token bucket whose burst is one "
            "second's worth, at least 1); null: no limit.",
            minimum=MIN_CLAIMS_PER_SECOND,
            maximum=MAX_CLAIMS_PER_SECOND,
        ),
    ),
    closed=True,
    min_fields=1,
    example={"max_in_flight": 20, "claims_per_second": 5},
)


WAIT_QUERY = Body(
    "TaskWaitQuery",
    "Wait for the task to finish.",
    (
        Field(
            "wait_seconds",
            Kind.NUMBER,
            "How long to wait for the task to finish (completed, dead, expired or "
            "cancelled) when it has not; 0 answers at once. The answer is the task either "
            "way: its status tells whether it finished.",
            default=0.0,
            minimum=0,
            maximum=Setting("max_wait_seconds"),
        ),
    ),
)


RUNTIMES_DEFAULT_LIMIT = 100


RUNTIMES_MAX_LIMIT = 1000


# Runtimes one request walks for a token limited to patterns, which may cover few of
# them: the page then holds the covered ones among these, possibly none, with a
# next_cursor to go on from. Bounds the request's work whatever the patterns.
PATTERN_WALK = 1000


RUNTIMES_QUERY = Body(
    "RuntimesQuery",
    "A page of the runtimes that have live tasks, in runtime id order.",
    (
        Field(
            "limit",
            Kind.INTEGER,
            "Runtimes per page.",
            default=RUNTIMES_DEFAULT_LIMIT,
            minimum=1,
            maximum=RUNTIMES_MAX_LIMIT,
        ),
        Field(
            "cursor",
            Kind.STRING,
            "The next_cursor of the previous page, as this token received it: opaque, "
            "and refused from another token.",
        ),
        Field(
            "include",
            Kind.STRING,
            "`sparkline`: each runtime also carries its queue depth over the last hour, "
            "from its history (`sparkline`), read for the whole page at once.",
            enum=("sparkline",),
            enum_name="RuntimeListInclude",  # http/history_docs.py
        ),
    ),
)
