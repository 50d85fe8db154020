"""What the load generator counts as a failure: load shed by the gateway (429, and 503
database_busy refused for the line's length before any work, to be retried) is
allowed and counted apart; any other error status, a database_busy after the whole
acquire timeout (a stalled Postgres) included, is a failure."""

from __future__ import annotations

from bench.client import Tally

SHED = (
    b'{"status": 503, "code": "database_busy", "detail": "the database queue is longer '
    b"than 250 ms of work (GATEWAY_DB_QUEUE_BUDGET_MS), or than 50 ms once it has stood "
    b'for 100 ms; retry"}'
)
# A stalled Postgres: the whole acquire timeout waited, not load shed.
STALLED = (
    b'{"status": 503, "code": "database_busy", "detail": "no database connection came free '
    b'within 5000 ms (GATEWAY_DB_ACQUIRE_TIMEOUT_MS); retry"}'
)
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
    tally.record(503, 0.01, STALLED)
    tally.record(500, 0.01, b"{}")
    assert tally.unexpected() == {"HTTP 503": 2, "HTTP 500": 1}
