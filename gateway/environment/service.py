"""The variables of the service itself: credentials, the limits on requests and polls,
shutdown and start-up, and logging."""

from __future__ import annotations

from ..variable import Variable
from .bounds import (
    LOG_FORMATS,
    MAX_JSON_DEPTH_LIMIT,
    MIN_ADMIN_TOKEN_CHARS,
    SWITCH,
)

TITLE = "The service"
SERVICE: tuple[Variable, ...] = (
    Variable(
        "GATEWAY_ADMIN_TOKEN",
        "admin_token",
        "optional",
        None,
        shown_default="(required unless auth is off)",
        doc=f"The bootstrap admin's bearer token, at least {MIN_ADMIN_TOKEN_CHARS} characters. "
        "Never logged.",
    ),
    Variable(
        "GATEWAY_AUTH",
        "auth_enabled",
        "switch",
        True,
        choices=SWITCH,
        doc="`off` disables authentication: local development only, loudly logged. Signed "
        "webhooks are checked either way.",
    ),
    Variable(
        "GATEWAY_MAX_WAIT_SECONDS",
        "max_wait_seconds",
        "number",
        60.0,
        low=0,
        high=3600,
        unit="seconds",
        doc="Largest `wait_seconds` a claim, or a wait for a task's result, may ask for.",
    ),
    Variable(
        "GATEWAY_DEFAULT_LEASE_SECONDS",
        "default_lease_seconds",
        "integer",
        60,
        low=1,
        high=3600,
        unit="seconds",
        doc="Lease length when a claim does not say.",
    ),
    Variable(
        "GATEWAY_MAX_PAYLOAD_BYTES",
        "max_payload_bytes",
        "integer",
        1_048_576,
        low=1,
        high=1 << 30,
        unit="bytes",
        doc="Largest `payload` (and `result`), counted as written out in full: a larger one "
        "is `413`.",
    ),
    Variable(
        "GATEWAY_MAX_BODY_BYTES",
        "max_body_bytes",
        "integer",
        16_777_216,
        low=1,
        high=1 << 31,
        unit="bytes",
        doc="Largest request body as sent, and most that its payloads or results may come to "
        "together, written out. A body being received is held in memory, so size this for "
        "your concurrency.",
    ),
    Variable(
        "GATEWAY_MAX_JSON_DEPTH",
        "max_json_depth",
        "integer",
        64,
        low=1,
        high=MAX_JSON_DEPTH_LIMIT,
        unit="levels",
        doc="Deepest nesting of a `payload`, `result` or webhook body; deeper is `422` naming "
        "the field.",
    ),
    Variable(
        "GATEWAY_READ_TIMEOUT_SECONDS",
        "read_timeout_seconds",
        "number",
        30.0,
        low=0.1,
        high=3600,
        unit="seconds",
        doc="Time for a request's head and body to arrive (then `408` and the connection is "
        "closed), and how long an answer may wait for its client with less than 16 KiB "
        "leaving (then the connection is cut).",
    ),
    Variable(
        "GATEWAY_MAX_CONCURRENT_CLAIMS",
        "max_concurrent_claims",
        "integer",
        16,
        low=1,
        high=10_000,
        unit="claims",
        doc="Postgres claims in flight per process; more wait in line.",
    ),
    Variable(
        "GATEWAY_MAX_QUEUED_CLAIMS",
        "max_queued_claims",
        "integer",
        1000,
        low=0,
        high=1_000_000,
        unit="claims",
        doc="Claims that may wait in that line before new ones get `429`.",
    ),
    Variable(
        "GATEWAY_MAX_PARKED_POLLS",
        "max_parked_polls",
        "integer",
        10_000,
        low=0,
        high=10_000_000,
        unit="requests",
        doc="Requests that may wait at once on one instance (claims waiting for work, and "
        "waits for a task's result); beyond, a request that would wait gets `429`.",
    ),
    Variable(
        "GATEWAY_MAX_ACTIVE_REQUESTS",
        "max_active_requests",
        "integer",
        128,
        low=1,
        high=1_000_000,
        unit="requests",
        doc="Load shedding: requests one instance works on at once (read and not yet "
        "answered, less the parked polls and result waits, which cost nothing while they "
        "wait). Beyond it, a claim that carries no completes or fails and does not wait "
        "gets `429 overloaded` with `Retry-After`, its connection read again after it.",
    ),
    Variable(
        "GATEWAY_DEGRADED_POLL_SECONDS",
        "degraded_poll_seconds",
        "number",
        1.0,
        low=0.05,
        high=60,
        unit="seconds",
        doc="While wake-ups may be lost (Redis failing, pub/sub down), how often a parked "
        "poll (or a wait for a task's result) checks Postgres instead; also how soon they "
        "re-check once Redis starts failing.",
    ),
    Variable(
        "GATEWAY_SYNC_MATCH",
        "sync_match_enabled",
        "switch",
        True,
        choices=SWITCH,
        doc="An enqueue (`POST /v1/runtimes/{rt}/tasks`) of a task due now, on an instance "
        "with polls parked for its runtime, writes the task already leased to the oldest of "
        "them in its own statement: no claim statement, no bump, no Redis round trip. It "
        "falls back to the usual path (bump, wake-up, claim) when runtime controls apply to "
        "the runtime, a wake-up is pending, or no poll is parked; a poll that left meanwhile "
        "gets nothing and the task goes back to the queue. `off`: every enqueue takes the "
        "usual path.",
    ),
    Variable(
        "GATEWAY_SHUTDOWN_GRACE_SECONDS",
        "shutdown_grace_seconds",
        "number",
        25.0,
        low=0,
        high=3600,
        unit="seconds",
        doc="How long SIGTERM waits for in-flight requests.",
    ),
    Variable(
        "GATEWAY_STARTUP_RETRY_SECONDS",
        "startup_retry_seconds",
        "number",
        0.0,
        low=0,
        high=3600,
        unit="seconds",
        doc="How long `gateway serve` waits at start for Postgres to answer and its schema "
        "to be current, for a pod that starts before its database. Meanwhile it listens: "
        "`/healthz` answers `200`, `/readyz` `503` saying what it waits for. When the time "
        "runs out it exits as it would have at once. `0`: no waiting; see "
        "[Starting the gateway](operations/startup.md).",
    ),
    # orjson writes at most ~254 levels: what is accepted must be answerable.,
    Variable(
        "GATEWAY_LOG_FORMAT",
        "log_format",
        "choice",
        "text",
        choices=LOG_FORMATS,
        doc="`gateway serve`'s log lines: `text` for people, `json` (one object per line, "
        "uvicorn's lines included) for a log collector; see "
        "[Logs and metrics](operations/metrics.md).",
    ),
    Variable(
        "GATEWAY_ACCESS_LOG_SAMPLE",
        "access_log_sample",
        "number",
        0.1,
        low=0,
        high=1,
        unit="share of requests",
        doc="The share of successful requests (status below 400, answered within a second) "
        "that get an access line, spread evenly: 0.1 is every tenth. Every error and every "
        "slower request always gets one; `1` logs every request. See "
        "[Logs and metrics](operations/metrics.md) for what a line costs.",
    ),
)
