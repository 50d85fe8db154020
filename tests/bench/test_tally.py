"""What the load generator counts as a failure: load shed by the gateway (429, and 503
database_busy: refused before any work, to be retried) is allowed and counted apart;
any other error status is a failure."""

from __future__ import annotations

from bench.client import Tally

SHED = b'{"status": 503, "code": "database_busy", "detail": "the database queue is longer"}'
DOWN = b'{"status": 503, "code": "store_unavailable", "detail": "the database failed"}'


def test_shed_requests_are_allowed_and_counted_other_errors_are_not() -> None:
    tally = Tally()
    tally.record(201, 0.01, b"{}")
    tally.record(429, 0.01, b'{"code": "overloaded"}')
    tally.record(503, 0.01, SHED)
    tally.record(503, 0.01, SHED)
    assert tally.unexpected() == {}
    assert tally.summary()["shed"] == 2
    tally.record(503, 0.01, DOWN)
    tally.record(500, 0.01, b"{}")
    assert tally.unexpected() == {"HTTP 503": 1, "HTTP 500": 1}
