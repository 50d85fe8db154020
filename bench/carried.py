"""The drain's one-at-a-time daemon whose claims carry the acknowledgements.

A worker that runs one task at a time claims one task (`max_tasks` 1), runs it (here a
no-op), and its next claim carries that task's complete (`complete: [{"id", "lease_id",
"result"}]`): one request per task instead of a claim and a complete. The claim's
answer says what became of the complete in `acks`; each must be `completed`. A claim
that got no answer, or an answer other than 200, is sent again with the same complete,
which the gateway answers `completed` again for the same lease (docs/api/overview.md,
"Reports carried by a claim"), so no task is completed twice.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from .client import Api
from .scenarios import MIN_WAIT_SECONDS, RETRY_PAUSE_SECONDS, ThroughputState

RESULT = {"ok": True}


def claim_body(worker: str, wait_seconds: float, held: dict[str, Any] | None) -> dict[str, Any]:
    """A claim of one task, carrying the held task's complete when there is one."""
    body: dict[str, Any] = {"worker_id": worker, "wait_seconds": wait_seconds, "max_tasks": 1}
    if held is not None:
        body["complete"] = [{"id": held["id"], "lease_id": held["lease_id"], "result": RESULT}]
    return body


def wait_for(
    opts: argparse.Namespace, remaining: float, st: ThroughputState, carrying: bool
) -> float:
    """The claim's wait in seconds: the scenario's, never past the deadline, and 0 for a
    claim that carries a complete once every task has been handed out. Such a long poll
    would otherwise hold its answer, and with it the complete's ack, for its whole wait:
    the drain would seem to end up to a wait later than it did. A claim that carries
    nothing still waits, rather than asking again and again for nothing."""
    if carrying and st.enqueued and len(st.delivered) >= len(st.enqueued):
        return 0.0
    return round(min(float(opts.wait_seconds), remaining), 3)


def record_ack(st: ThroughputState, answer: Any, task_id: str, claimed_at: float) -> bool:
    """Count the ack of the carried complete of `task_id` (claimed at `claimed_at`,
    perf_counter seconds). False when the answer carries no ack for it: the gateway
    does not take reports with a claim."""
    acks = answer.get("acks") if isinstance(answer, dict) else None
    entry = next((a for a in acks or [] if str(a.get("id")) == task_id), None)
    if entry is None:
        return False
    st.carried_acked += 1
    outcome = str(entry.get("outcome"))
    st.ack_outcomes[outcome] += 1
    if outcome == "completed":
        st.done([task_id], claimed_at)
    return True


async def carried_daemon(
    api: Api,
    opts: argparse.Namespace,
    runtime: str,
    worker: str,
    deadline: float,
    st: ThroughputState,
) -> None:
    """One worker running one task at a time: each claim after the first carries the
    previous task's complete, and nothing else is sent for it. A task still held when
    the loop ends (its deadline, or the watchdog stopping the drain) is completed on its
    own (`POST /v1/tasks/{id}/complete`), so that no lease is left held."""
    path = f"/v1/runtimes/{runtime}/claim"
    held: dict[str, Any] | None = None
    held_claimed_at = 0.0
    while not st.stop.is_set():
        remaining = deadline - time.perf_counter()
        if remaining < MIN_WAIT_SECONDS:
            break
        wait = wait_for(opts, remaining, st, held is not None)
        body = claim_body(worker, wait, held)
        if held is not None:
            st.carried_sent += 1
        started = time.perf_counter()
        got = await api.post(path, body, st.claims, seconds=wait + 30.0)
        if got is None or got[0] != 200:
            if got is not None and got[0] == 422 and held is not None:
                st.carried_missing = True  # the gateway refuses a claim's `complete`
                st.stop.set()
                break
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
            continue  # the same complete goes with the next claim
        answer = got[1] or {}
        if held is not None:
            if not record_ack(st, answer, str(held["id"]), held_claimed_at):
                st.carried_missing = True  # answered without acks: the complete was ignored
                st.stop.set()
                break
            held = None
        tasks = answer.get("tasks") or []
        if tasks:
            held, held_claimed_at = tasks[0], started
            task_id = str(held.get("id"))
            st.delivered[task_id] += 1
            if task_id not in st.enqueued:
                st.unknown.add(task_id)
        elif answer.get("retry_after_seconds"):
            pause = float(answer["retry_after_seconds"])
            await asyncio.sleep(min(pause, max(deadline - time.perf_counter(), 0.0)))
        else:
            st.empty_claims += 1
    if held is not None and not st.carried_missing:
        await _complete_alone(api, held, held_claimed_at, st)


async def _complete_alone(
    api: Api, task: dict[str, Any], claimed_at: float, st: ThroughputState
) -> None:
    task_id = str(task.get("id"))
    body = {"lease_id": task.get("lease_id"), "result": RESULT}
    st.completes_sent += 1
    got = await api.post(f"/v1/tasks/{task_id}/complete", body, st.completes, seconds=30.0)
    if got is None or got[0] != 200:
        return
    st.done([task_id], claimed_at)
