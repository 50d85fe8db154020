"""Schemathesis hooks for the whole-API run (tests/e2e/test_schemathesis_run.py), loaded
through SCHEMATHESIS_HOOKS. This module holds no tests. Importing it also registers the
check that a problem's code is one its answer lists (tests/support/openapi.py).

`positive_data_acceptance` expects every request the document calls valid to succeed.
A few refusals of such requests come from rules that JSON Schema cannot state: they
depend on the server's state or clock, or tie two values together. Each is listed here
with its reason, matched by the problem's code and a piece of its detail, and only that
refusal is forgiven; any other refusal of valid data still fails the run, and so would
a refusal listed here answered with another code.
"""

from __future__ import annotations

from typing import Any

import schemathesis

# Registers the check that a problem's code is one its answer lists, for this run too.
from tests.support.openapi import problem_code_conformance  # noqa: F401

# (problem code, a piece of its detail): why the document cannot say it.
UNSTATABLE = (
    # The key was used before with another request: the server's state, not the shape.
    ("idempotency_key_reused", "was already used"),
    # A pause's end must lie ahead of the server's clock.
    ("validation_failed", "until must be in the future"),
    # A cursor is opaque: only the next_cursor the server returned continues a listing.
    ("validation_failed", "is not one this server returned as next_cursor"),
    # A batch lease operation names each task once: unique ids across items.
    ("validation_failed", "a batch may name a task once"),
    # The Idempotency-Key header and the body's idempotency_key must agree.
    ("bad_request", "idempotency_key in the body and the Idempotency-Key header differ"),
    # A time's year must lie from 1970 to 9000; JSON Schema's date-time has no bounds.
    ("validation_failed", "must lie between 1970 and 9000"),
    # A schedule's cron and time zone: a grammar and a database no pattern states.
    ("validation_failed", "cannot be read"),
    ("validation_failed", "never fires"),
    ("validation_failed", "unknown time zone"),
    ("validation_failed", "cron must have 5 fields"),
    # A backfill's range: in the past, within the tick record, at most 1,000 ticks.
    ("validation_failed", "must be within the last"),
    ("validation_failed", "end must not be in the future"),
    ("validation_failed", "start must not be after end"),
    ("validation_failed", "the range holds more than"),
)


def unstatable(body: Any) -> bool:
    """Whether a problem answer is one of the refusals listed above."""
    if not isinstance(body, dict):
        return False
    code, detail = body.get("code"), str(body.get("detail", ""))
    return any(code == c and piece in detail for c, piece in UNSTATABLE)


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but a listed refusal of data the document calls valid."""
    if type(failure).__name__ != "RejectedPositiveData":
        return True
    try:
        body = response.json()
    except ValueError:
        return True
    return not unstatable(body)
