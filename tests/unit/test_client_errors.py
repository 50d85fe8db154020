"""The client maps every problem `code` the gateway can answer with to its own class."""

from __future__ import annotations

import gateway.errors as server
from gateway_client import errors as client

# Codes whose answer no client ever reads: client_gone is raised for a request whose
# client closed its connection, and its answer is written nowhere.
NEVER_READ = {"client_gone"}


def _server_codes() -> set[str]:
    codes = set()
    for value in vars(server).values():
        if isinstance(value, type) and issubclass(value, server.GatewayError):
            codes.add(value.code)
    return codes - NEVER_READ


def test_every_server_code_has_a_client_class():
    missing = _server_codes() - set(client.BY_CODE)
    assert not missing, f"codes the client does not map: {sorted(missing)}"


def test_code_wins_over_status_and_retry_after_is_read():
    exc = client.error_from_answer(
        429, {"code": "overloaded", "detail": "busy"}, {"Retry-After": "3"}
    )
    assert isinstance(exc, client.Overloaded)
    assert exc.retry_after_seconds == 3.0 and exc.retryable and exc.detail == "busy"
    lost = client.error_from_answer(409, {"code": "lease_lost", "detail": "gone"})
    assert isinstance(lost, client.LeaseLost) and not lost.retryable


def test_an_answer_that_is_not_a_problem_falls_back_to_its_status():
    assert isinstance(client.error_from_answer(502, "<html>bad gateway"), client.ServerError)
    assert isinstance(client.error_from_answer(404, None), client.NotFound)
    assert client.error_from_answer(503, None, {"Retry-After": "soon"}).retry_after_seconds is None


def test_validation_names_its_field():
    exc = client.error_from_answer(
        422, {"code": "validation_failed", "detail": "no", "field": "max_tasks"}
    )
    assert isinstance(exc, client.ValidationFailed) and exc.field == "max_tasks"
