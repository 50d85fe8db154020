"""One error hierarchy for the whole gateway, and the one table that maps it to HTTP.

Driver errors (asyncpg, redis) never cross the store and cache boundary: they are
translated there into the classes below.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""

    code = "internal_error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def headers(self) -> dict[str, str]:
        """Response headers this error's answer must carry."""
        return {}


class ConfigError(GatewayError):
    """A setting is missing or out of range; raised at start-up."""

    code = "config_error"


class BadRequest(GatewayError):
    """The body is not JSON, or headers contradict each other."""

    code = "bad_request"


class ValidationFailed(GatewayError):
    """A field is missing, of the wrong type or out of range. `extra['field']` names it."""

    code = "validation_failed"


class IdempotencyKeyReused(ValidationFailed):
    """The idempotency key was used before with a different request."""

    code = "idempotency_key_reused"


class RequestTimeout(GatewayError):
    """The request's head and body did not arrive within GATEWAY_READ_TIMEOUT_SECONDS."""

    code = "request_timeout"


class HeadersTooLarge(GatewayError):
    """The request line and headers are over the server's head limit (64 KiB)."""

    code = "request_header_fields_too_large"


class PayloadTooLarge(GatewayError):
    code = "payload_too_large"


class RequestTooLarge(PayloadTooLarge):
    """The request as a whole is over a limit, not one of its items: a batch names no
    item for it."""


class Unauthorized(GatewayError):
    """No usable credentials. `invalid_token`: some were sent, and they are wrong."""

    code = "unauthorized"

    def __init__(self, detail: str, invalid_token: bool = False) -> None:
        super().__init__(detail)
        self.invalid_token = invalid_token

    def headers(self) -> dict[str, str]:
        # RFC 6750 section 3: a 401 names the scheme, and says when a token was rejected.
        challenge = 'Bearer realm="claim-gateway"'
        if self.invalid_token:
            challenge += ', error="invalid_token"'
        return {"WWW-Authenticate": challenge}


class InvalidSignature(Unauthorized):
    """A webhook delivery whose Standard Webhooks signature is missing, stale or matches
    no live secret covering its runtime."""

    code = "invalid_signature"

    def headers(self) -> dict[str, str]:
        # A 401 must carry a challenge (RFC 9110 section 15.5.2); this one names the
        # scheme expected here instead of Bearer.
        return {"WWW-Authenticate": 'Webhook-Signature realm="claim-gateway"'}


class Forbidden(GatewayError):
    code = "forbidden"


class NotFound(GatewayError):
    code = "not_found"


class MethodNotAllowed(GatewayError):
    code = "method_not_allowed"


class LeaseLost(GatewayError):
    """The lease_id given is not the task's current lease (I7)."""

    code = "lease_lost"


class Conflict(GatewayError):
    """The task is not in a state that allows the operation."""

    code = "invalid_state"


class AlreadyExists(GatewayError):
    """A live token or webhook secret already has this name."""

    code = "already_exists"


class RetryLater(GatewayError):
    """An error whose request may be sent again as it is after `retry_after_seconds`,
    said in the Retry-After header and in the problem body."""

    def __init__(self, detail: str, retry_after_seconds: int = 1) -> None:
        super().__init__(detail, retry_after_seconds=retry_after_seconds)
        self.retry_after_seconds = retry_after_seconds

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_seconds)}


class Overloaded(RetryLater):
    """Too many Postgres claims are queued in this process; retry later."""

    code = "overloaded"


class Draining(RetryLater):
    """The process is shutting down and takes no new claims. Said with Retry-After
    (1 s): sent again, the request reaches another instance."""

    code = "draining"


class StoreUnavailable(RetryLater):
    """Postgres could not be reached or failed the statement. Said with Retry-After
    (1 s): a failover or a restart is usually over within seconds, and a client that
    honours it does not hammer a recovering database. The request may have been applied
    if the failure came after its commit: an enqueue retried with its idempotency key is
    safe."""

    code = "store_unavailable"


class DatabaseBusy(StoreUnavailable):
    """Every pooled Postgres connection stayed busy past the acquire timeout. Nothing
    was sent to Postgres; the request may be retried as it is."""

    code = "database_busy"


class ClientGone(GatewayError):
    """The client closed its connection before its request of work (an enqueue, a read)
    got a database connection: the request was not started, and nobody is there to
    read an answer (gateway/admission.py)."""

    code = "client_gone"


class CacheUnavailable(GatewayError):
    """Redis failed or timed out. Callers treat it as a cache miss (I5, fail open)."""

    code = "cache_unavailable"


# error class -> (HTTP status, title). The only place statuses are chosen.
PROBLEMS: dict[type[GatewayError], tuple[int, str]] = {
    BadRequest: (400, "Bad request"),
    Unauthorized: (401, "Unauthorized"),
    InvalidSignature: (401, "Unauthorized"),
    Forbidden: (403, "Forbidden"),
    NotFound: (404, "Not found"),
    MethodNotAllowed: (405, "Method not allowed"),
    LeaseLost: (409, "Lease lost"),
    Conflict: (409, "Conflict"),
    AlreadyExists: (409, "Conflict"),
    RequestTimeout: (408, "Request timeout"),
    PayloadTooLarge: (413, "Payload too large"),
    HeadersTooLarge: (431, "Request header fields too large"),
    ValidationFailed: (422, "Validation failed"),
    Overloaded: (429, "Too many requests"),
    Draining: (503, "Shutting down"),
    StoreUnavailable: (503, "Database unavailable"),
    DatabaseBusy: (503, "Database busy"),
    CacheUnavailable: (503, "Cache unavailable"),
    # The status nginx logs for a client that left: written nowhere, the access log's.
    ClientGone: (499, "Client closed request"),
    ConfigError: (500, "Configuration error"),
}


def problem_for(error: GatewayError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and RFC 9457 problem body for an error."""
    status, title = 500, "Internal error"
    for cls in type(error).__mro__:
        if cls in PROBLEMS:
            status, title = PROBLEMS[cls]
            break
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": error.detail,
        "code": error.code,
    }
    body.update(error.extra)
    return status, body


class StartupError(Exception):
    """A start of `gateway serve` that cannot go on. Never an HTTP answer, so not a
    GatewayError: its `detail` (one or two lines) goes to stderr, and its class chooses
    the exit code (gateway/cli/startup.py)."""

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class Unreachable(StartupError):
    """A server the gateway needs (Postgres, an embedded server) cannot be reached or
    started, or the address to listen on is taken. Not Redis: the gateway starts
    without it and fails open (I5)."""


class SchemaNotCurrent(StartupError):
    """The database has no claim-gateway schema, or one older than this release
    (migrations are pending), or an applied migration's file was edited."""
