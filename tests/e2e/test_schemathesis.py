"""Schemathesis fuzzes the task operations of the OpenAPI document on live tasks (a
claimed one, a cancelled one) against a real gateway (Postgres and Redis from the
fixtures): no answer may be a 5xx, and every status, content type, header and body must
be one the document promises. Every operation, with every check and phase, is fuzzed by
schemathesis's own run in tests/e2e/test_schemathesis_run.py.

schemathesis calls the gateway synchronously, so it runs in a thread of its own, with
GATEWAY_MAX_WAIT_SECONDS at 1 so that generated long polls stay short. Examples come
from a fixed seed: a failure repeats, and so does the run's length.
"""

from __future__ import annotations

import json
import secrets
import urllib.request
from typing import Any

import requests
import schemathesis

from tests.support.gateways import Served
from tests.support.openapi import AUTH, CHECKS, DOCUMENT, fuzz_settings, schema


def test_the_served_document_is_the_fuzzed_one(served: Served) -> None:
    with urllib.request.urlopen(served.url + "/openapi.json", timeout=10) as resp:
        assert resp.headers["Content-Type"] == "application/json"
        assert json.load(resp) == DOCUMENT


def live_task(base: str, cancelled: bool) -> dict[str, Any]:
    """A task of a fresh runtime, claimed (or, with `cancelled`, cancelled)."""
    runtime = f"{base}/v1/runtimes/live-{secrets.token_hex(6)}"
    resp = requests.post(f"{runtime}/tasks", json={"payload": {"n": 1}}, headers=AUTH, timeout=10)
    task: dict[str, Any] = resp.json()
    if cancelled:
        requests.post(f"{base}/v1/tasks/{task['id']}/cancel", headers=AUTH, timeout=10)
        return task
    resp = requests.post(f"{runtime}/claim", json={"worker_id": "fuzz"}, headers=AUTH, timeout=10)
    claimed: dict[str, Any] = resp.json()["tasks"][0]
    return claimed


@schema.include(path_regex=r"^/v1/tasks/").parametrize()
@fuzz_settings
def test_task_operations_on_live_tasks(case: schemathesis.Case, served: Served) -> None:
    """The same, on a task that exists and holds a lease (a cancelled one for retry),
    so that the answers are tasks and conflicts rather than 404s."""
    task = live_task(served.url, cancelled=case.operation.path.endswith("/retry"))
    case.path_parameters["task_id"] = task["id"]
    if isinstance(case.body, dict) and "lease_id" in case.body:
        case.body["lease_id"] = task["lease_id"]
    case.call_and_validate(base_url=served.url, checks=CHECKS, timeout=30)
