"""A task's life through the Python client that openapi-python-client generates from
the gateway's OpenAPI document: enqueue (whole, then with `Prefer: return=minimal`),
claim, complete and read. `make clients-check` type-checks it with `mypy --strict` and
runs it against a real gateway, the generated package `claim_gateway_client` on its
path:

    python flow.py GATEWAY_URL TOKEN
"""

from __future__ import annotations

import sys
from typing import NoReturn
from uuid import UUID

from claim_gateway_client import AuthenticatedClient
from claim_gateway_client.api.daemons import claim_tasks, complete_task
from claim_gateway_client.api.producers import enqueue_task, get_task
from claim_gateway_client.models import (
    ClaimedTaskList,
    ClaimRequest,
    CompleteRequest,
    EnqueueRequest,
    Problem,
    ProblemCode,
    Task,
    TaskRef,
    TaskStatus,
)
from claim_gateway_client.types import Unset

RUNTIME = "clients-python"


def fail(step: str, answer: object) -> NoReturn:
    raise SystemExit(f"python client: {step} answered {answer!r}")


def main(base_url: str, token: str) -> None:
    # Only what is given is sent: the server fills in priority, max_attempts, the lease.
    body = EnqueueRequest(payload={"n": 1, "text": "from Python"})
    if body.to_dict() != {"payload": {"n": 1, "text": "from Python"}}:
        fail("an enqueue body of its payload alone", body.to_dict())
    claim = ClaimRequest(worker_id="python-worker", max_tasks=2, wait_seconds=5)
    if set(claim.to_dict()) != {"worker_id", "max_tasks", "wait_seconds"}:
        fail("a claim body of the fields given", claim.to_dict())

    with AuthenticatedClient(base_url=base_url, token=token) as client:
        task = enqueue_task.sync(RUNTIME, client=client, body=body)
        if not isinstance(task, Task):
            fail("enqueue (a whole task expected)", task)
        ref = enqueue_task.sync(
            RUNTIME, client=client, body=EnqueueRequest(payload={"n": 2}), prefer="return=minimal"
        )
        if not isinstance(ref, TaskRef):
            fail("enqueue with return=minimal (an id alone expected)", ref)

        claimed = claim_tasks.sync(RUNTIME, client=client, body=claim)
        if not isinstance(claimed, ClaimedTaskList):
            fail("claim", claimed)
        if sorted(t.id for t in claimed.tasks) != sorted([task.id, ref.id]):
            fail("claim (both tasks expected)", claimed)

        for held in claimed.tasks:
            result = {"doubled": 2 * held.attempts}
            done = complete_task.sync(
                held.id, client=client, body=CompleteRequest(lease_id=held.lease_id, result=result)
            )
            if not isinstance(done, Task) or done.status is not TaskStatus.COMPLETED:
                fail("complete", done)

        read = get_task.sync(task.id, client=client)
        if not isinstance(read, Task) or read.status is not TaskStatus.COMPLETED:
            fail("read (a completed task expected)", read)
        if isinstance(read.result, Unset) or read.result != {"doubled": 2}:
            fail("read (the task's result expected)", read.result)

        unknown = get_task.sync(UUID("00000000-0000-4000-8000-000000000000"), client=client)
        if not isinstance(unknown, Problem) or unknown.code is not ProblemCode.NOT_FOUND:
            fail("read of an unknown task (a not_found problem expected)", unknown)
    print("python client: enqueue, claim, complete and read: ok")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python flow.py GATEWAY_URL TOKEN")
    main(sys.argv[1], sys.argv[2])
