"""The errors a call can raise: one class per problem `code` the gateway answers with,
plus TransportError for answers that never came.

`error_from_answer` maps an HTTP answer to its class: by the problem body's `code`
first, by the status when the body is not a problem (a proxy's 502, say).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class GatewayError(Exception):
    """Base of every error the client raises. `retryable`: the same call may succeed
    later (overload, shutdown, a database or network failure)."""

    code = "internal_error"
    retryable = False

    def __init__(
        self,
        detail: str,
        *,
        status: int | None = None,
        problem: Mapping[str, Any] | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.problem: Mapping[str, Any] = problem or {}
        # From the Retry-After header of a 429 or 503, when the gateway sent one.
        self.retry_after_seconds = retry_after_seconds

    @property
    def field(self) -> str | None:
        """The request field a 422 names, if any."""
        value = self.problem.get("field")
        return value if isinstance(value, str) else None


class TransportError(GatewayError):
    """No answer: the connection failed, was cut, or the call timed out."""

    code = "transport_error"
    retryable = True


class ServerError(GatewayError):
    """A 5xx the gateway did not explain (an unexpected error, or a proxy's answer)."""

    code = "internal_error"
    retryable = True


class BadRequest(GatewayError):
    code = "bad_request"


class ValidationFailed(GatewayError):
    """A field is missing or out of range; `field` names it."""

    code = "validation_failed"


class IdempotencyKeyReused(ValidationFailed):
    code = "idempotency_key_reused"


class RequestTimeout(GatewayError):
    code = "request_timeout"
    retryable = True


class HeadersTooLarge(GatewayError):
    code = "request_header_fields_too_large"


class PayloadTooLarge(GatewayError):
    code = "payload_too_large"


class Unauthorized(GatewayError):
    code = "unauthorized"


class InvalidSignature(Unauthorized):
    code = "invalid_signature"


class Forbidden(GatewayError):
    code = "forbidden"


class NotFound(GatewayError):
    code = "not_found"


class MethodNotAllowed(GatewayError):
    code = "method_not_allowed"


class LeaseLost(GatewayError):
    """The lease is no longer the task's: another daemon may hold it now."""

    code = "lease_lost"


class InvalidState(GatewayError):
    """The task is not in a state that allows the operation (retry of a queued task)."""

    code = "invalid_state"


class AlreadyExists(GatewayError):
    code = "already_exists"


class Overloaded(GatewayError):
    """429: too many claims waiting; `retry_after_seconds` says when to come back."""

    code = "overloaded"
    retryable = True


class Draining(GatewayError):
    """503: the instance is shutting down; another one may take the call."""

    code = "draining"
    retryable = True


class StoreUnavailable(GatewayError):
    code = "store_unavailable"
    retryable = True


class DatabaseBusy(StoreUnavailable):
    """503: every database connection of the instance stayed busy; nothing was done,
    and the call may be sent again as it is after `retry_after_seconds`."""

    code = "database_busy"
    retryable = True


class CacheUnavailable(GatewayError):
    code = "cache_unavailable"
    retryable = True


class ConfigError(GatewayError):
    code = "config_error"


class WaitTimedOut(GatewayError):
    """Raised by the client's `wait()`, not answered by the gateway: the task had not
    finished when the wait's timeout ended. `task` is the task as last read."""

    code = "wait_timed_out"
    retryable = True

    def __init__(self, detail: str, task: Any) -> None:
        super().__init__(detail)
        self.task = task


BY_CODE: dict[str, type[GatewayError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        ValidationFailed,
        IdempotencyKeyReused,
        RequestTimeout,
        HeadersTooLarge,
        PayloadTooLarge,
        Unauthorized,
        InvalidSignature,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        LeaseLost,
        InvalidState,
        AlreadyExists,
        Overloaded,
        Draining,
        StoreUnavailable,
        DatabaseBusy,
        CacheUnavailable,
        ConfigError,
        ServerError,
    )
}

BY_STATUS: dict[int, type[GatewayError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: InvalidState,
    413: PayloadTooLarge,
    422: ValidationFailed,
    429: Overloaded,
    431: HeadersTooLarge,
}


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; the HTTP-date form is not sent by the gateway and is ignored."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_answer(
    status: int, body: Any, headers: Mapping[str, str] | None = None
) -> GatewayError:
    """The exception for an error answer: its problem `code`, else its status."""
    problem: Mapping[str, Any] = body if isinstance(body, Mapping) else {}
    code = problem.get("code")
    cls = BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = BY_STATUS.get(status, ServerError if status >= 500 else GatewayError)
    detail = problem.get("detail")
    if not isinstance(detail, str):
        detail = f"HTTP {status}" + (f": {str(body)[:200]}" if body else "")
    retry_after = parse_retry_after((headers or {}).get("Retry-After"))
    return cls(detail, status=status, problem=problem, retry_after_seconds=retry_after)
