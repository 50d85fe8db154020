"""The drain's simulated daemon claims its next batch while the last one's
acknowledgement is unanswered, keeps at most one batch's acknowledgement in flight, and
never has more requests in flight than the load generator has connections for it."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import pytest

from bench.client import Tally
from bench.scenarios import ThroughputState, _connections, _daemon


class DrainApi:
    """Claims hand out the given batches, then nothing (after a short park);
    acknowledgements (single or batch) are received and held until `hold` is set."""

    def __init__(self, batches: list[list[str]]) -> None:
        self.batches = [[{"id": i, "lease_id": f"lease-{i}"} for i in b] for b in batches]
        self.hold = asyncio.Event()
        self.claims = 0
        self.acking: set[str] = set()  # task ids whose acknowledgement is unanswered
        self.most_acking = 0
        self.in_flight = 0
        self.most_in_flight = 0

    async def post(self, path: str, body: Any, tally: Tally, *, seconds: float = 30.0) -> Any:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # a request is never answered at once
            if path.endswith("/claim"):
                self.claims += 1
                tasks = self.batches.pop(0) if self.batches else []
                if not tasks:
                    await asyncio.sleep(min(body["wait_seconds"], 0.05))
                tally.record(200, 0.001, b"")
                return 200, {"tasks": tasks}
            if path == "/v1/tasks:complete":
                ids = [t["id"] for t in body["tasks"]]
            else:  # /v1/tasks/{id}/complete
                ids = [path.split("/")[3]]
            self.acking.update(ids)
            self.most_acking = max(self.most_acking, len(self.acking))
            await self.hold.wait()
            self.acking.difference_update(ids)
            tally.record(200, 0.001, b"")
            if path == "/v1/tasks:complete":
                return 200, {"results": [{"id": i, "outcome": "completed"} for i in ids]}
            return 200, {"id": ids[0], "status": "completed"}
        finally:
            self.in_flight -= 1


async def until(condition: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("batch_ack", [False, True], ids=["single ack", "batch ack"])
async def test_the_next_batch_is_claimed_while_one_acknowledgement_is_in_flight(batch_ack: bool):
    api = DrainApi([["a", "b"], ["c", "d"], ["e", "f"]])
    opts = argparse.Namespace(wait_seconds=1.0, max_tasks=2, batch_ack=batch_ack)
    st = ThroughputState({i: 0.0 for i in "abcdef"})
    daemon = asyncio.create_task(
        _daemon(api, opts, "rt", "bench-0", time.perf_counter() + 10, st)  # type: ignore[arg-type]
    )
    # The second claim goes out while a and b are unanswered.
    await until(lambda: api.claims >= 2)
    await asyncio.sleep(0.2)
    # It was answered; c and d wait for a and b's answer (one batch's acknowledgement
    # in flight at most), and no further claim goes out until theirs is sent.
    assert api.acking == {"a", "b"} and api.claims == 2 and len(api.batches) == 1
    api.hold.set()
    await asyncio.wait_for(daemon, 5)
    assert st.all_done.is_set()
    assert dict(st.completed) == dict.fromkeys("abcdef", 1)
    assert dict(st.delivered) == dict.fromkeys("abcdef", 1)
    assert api.most_acking == 2
    # The load generator's session has a connection for each request in flight.
    room = _connections(argparse.Namespace(pollers=1, enqueue_concurrency=0, **vars(opts)))
    none = _connections(argparse.Namespace(pollers=0, enqueue_concurrency=0, **vars(opts)))
    assert api.most_in_flight == (3 if not batch_ack else 2)
    assert api.most_in_flight <= room - none
