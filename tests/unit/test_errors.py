"""problem_for: the one table that maps gateway errors to HTTP problems (RFC 9457)."""

from __future__ import annotations

import pytest

from gateway import errors
from gateway.errors import GatewayError, problem_for

# Written out by hand from the design, not read from PROBLEMS, so that a change there fails.
EXPECTED: list[tuple[type[GatewayError], int, str, str]] = [
    (errors.BadRequest, 400, "bad_request", "Bad request"),
    (errors.Unauthorized, 401, "unauthorized", "Unauthorized"),
    (errors.InvalidSignature, 401, "invalid_signature", "Unauthorized"),
    (errors.Forbidden, 403, "forbidden", "Forbidden"),
    (errors.NotFound, 404, "not_found", "Not found"),
    (errors.MethodNotAllowed, 405, "method_not_allowed", "Method not allowed"),
    (errors.LeaseLost, 409, "lease_lost", "Lease lost"),
    (errors.Conflict, 409, "invalid_state", "Conflict"),
    (errors.AlreadyExists, 409, "already_exists", "Conflict"),
    (errors.RequestTimeout, 408, "request_timeout", "Request timeout"),
    (errors.PayloadTooLarge, 413, "payload_too_large", "Payload too large"),
    (
        errors.HeadersTooLarge,
        431,
        "request_header_fields_too_large",
        "Request header fields too large",
    ),
    (errors.ValidationFailed, 422, "validation_failed", "Validation failed"),
    (errors.IdempotencyKeyReused, 422, "idempotency_key_reused", "Validation failed"),
    (errors.Overloaded, 429, "overloaded", "Too many requests"),
    (errors.Draining, 503, "draining", "Shutting down"),
    (errors.StoreUnavailable, 503, "store_unavailable", "Database unavailable"),
    (errors.DatabaseBusy, 503, "database_busy", "Database busy"),
    (errors.CacheUnavailable, 503, "cache_unavailable", "Cache unavailable"),
    (errors.ClientGone, 499, "client_gone", "Client closed request"),
    (errors.ConfigError, 500, "config_error", "Configuration error"),
]


def test_every_table_entry_is_covered() -> None:
    assert set(errors.PROBLEMS) <= {cls for cls, *_ in EXPECTED}


@pytest.mark.parametrize(("cls", "status", "code", "title"), EXPECTED)
def test_problem_for_each_class(
    cls: type[GatewayError], status: int, code: str, title: str
) -> None:
    got_status, body = problem_for(cls("what went wrong"))
    assert got_status == status
    assert body["status"] == status
    assert body["code"] == code
    assert body["title"] == title
    assert body["detail"] == "what went wrong"
    assert body["type"] == "about:blank"


@pytest.mark.parametrize(
    "cls",
    [
        cls
        for cls, status, *_ in EXPECTED
        if status in (429, 503) and cls.code != "cache_unavailable"
    ],
)
def test_every_answer_that_asks_to_retry_says_when(cls: type[GatewayError]) -> None:
    """429 and 503 answers carry Retry-After (cache_unavailable is never an answer: it
    is a miss, I5), so that a client that honours it waits instead of hammering."""
    assert cls("busy").headers() == {"Retry-After": "1"}


def test_extra_fields_reach_the_body() -> None:
    status, body = problem_for(errors.ValidationFailed("priority out of range", field="priority"))
    assert status == 422
    assert body["field"] == "priority"


def test_overloaded_carries_retry_after() -> None:
    status, body = problem_for(errors.Overloaded("busy", retry_after_seconds=3))
    assert status == 429
    assert body["retry_after_seconds"] == 3


def test_error_headers() -> None:
    assert errors.Overloaded("busy", retry_after_seconds=3).headers() == {"Retry-After": "3"}
    assert errors.Unauthorized("no header").headers() == {
        "WWW-Authenticate": 'Bearer realm="claim-gateway"'
    }
    assert errors.Unauthorized("bad", invalid_token=True).headers() == {
        "WWW-Authenticate": 'Bearer realm="claim-gateway", error="invalid_token"'
    }
    assert errors.InvalidSignature("bad").headers() == {
        "WWW-Authenticate": 'Webhook-Signature realm="claim-gateway"'
    }
    assert errors.NotFound("x").headers() == {}


def test_unknown_gateway_error_is_500() -> None:
    class Surprise(GatewayError):
        pass

    status, body = problem_for(Surprise("nobody mapped me"))
    assert status == 500
    assert body["status"] == 500
    assert body["title"] == "Internal error"
    assert body["code"] == "internal_error"
    assert body["detail"] == "nobody mapped me"


def test_base_gateway_error_is_500() -> None:
    status, body = problem_for(GatewayError("plain"))
    assert status == 500
    assert body["code"] == "internal_error"


def test_subclass_of_a_mapped_class_inherits_its_status() -> None:
    class TaskGone(errors.NotFound):
        code = "task_gone"

    status, body = problem_for(TaskGone("gone"))
    assert status == 404
    assert body["title"] == "Not found"
    assert body["code"] == "task_gone"
