"""The drain's one-at-a-time daemon: each claim after the first carries the previous
task's complete and nothing else is sent for it; a claim without an answer is sent
again with the same complete; a gateway that ignores the complete makes the row
unavailable."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.carried import carried_daemon
from bench.client import Tally
from bench.scenarios import ThroughputState, _connections


class CarryingApi:
    """A gateway of one runtime: claims hand out the queued tasks one at a time and
    answer the completes they carry in `acks`. `lose` answers of claims are lost
    (None, as after a transport error) after their completes were applied."""

    def __init__(self, ids: list[str], *, lose: int = 0, acks: bool = True) -> None:
        self.queued = list(ids)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.applied: dict[str, int] = {}  # task id -> completes applied
        self.lose = lose
        self.acks = acks

    async def post(self, path: str, body: Any, tally: Tally, *, seconds: float = 30.0) -> Any:
        self.sent.append((path, body))
        await asyncio.sleep(0)
        assert path.endswith("/claim"), f"a request other than a claim: {path}"
        assert body["max_tasks"] == 1
        entries = []
        for item in body.get("complete", []):
            assert item["lease_id"] == f"lease-{item['id']}"
            self.applied[item["id"]] = self.applied.get(item["id"], 0) + 1
            entries.append({"id": item["id"], "outcome": "completed"})
        if self.lose:
            self.lose -= 1
            tally.failed(TimeoutError("lost"))
            return None
        tasks = []
        if self.queued:
            task_id = self.queued.pop(0)
            tasks = [{"id": task_id, "lease_id": f"lease-{task_id}"}]
        elif body["wait_seconds"]:
            await asyncio.sleep(min(body["wait_seconds"], 0.05))
        tally.record(200, 0.001, b"")
        answer: dict[str, Any] = {"tasks": tasks}
        if "complete" in body and self.acks:
            answer["acks"] = entries
        return 200, answer


def _opts() -> argparse.Namespace:
    return argparse.Namespace(wait_seconds=1.0, max_tasks=1, carried=True)


async def _drain(api: CarryingApi, ids: str) -> ThroughputState:
    st = ThroughputState({i: 0.0 for i in ids})
    daemon = carried_daemon(api, _opts(), "rt", "bench-0", time.perf_counter() + 10, st)  # type: ignore[arg-type]
    await asyncio.wait_for(daemon, 5)
    return st


async def test_each_claim_carries_the_previous_tasks_complete_and_nothing_else_is_sent():
    api = CarryingApi(list("abc"))
    st = await _drain(api, "abc")
    carried = [[c["id"] for c in body.get("complete", [])] for _, body in api.sent]
    assert carried == [[], ["a"], ["b"], ["c"]]
    assert st.all_done.is_set()
    assert dict(st.completed) == dict.fromkeys("abc", 1)
    assert dict(st.delivered) == dict.fromkeys("abc", 1)
    assert api.applied == dict.fromkeys("abc", 1)
    assert (st.carried_sent, st.carried_acked) == (3, 3)
    # The last complete is not held back by a long poll: nothing is left to hand out.
    assert api.sent[-1][1]["wait_seconds"] == 0
    assert api.sent[1][1]["wait_seconds"] == 1.0


async def test_a_claim_without_an_answer_is_sent_again_with_the_same_complete():
    api = CarryingApi(list("ab"))
    st = ThroughputState(dict.fromkeys("ab", 0.0))
    real_post = api.post
    calls = {"n": 0}

    async def lose_second(path: str, body: Any, tally: Tally, *, seconds: float = 30.0) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the claim carrying a's complete: applied, answer lost
            api.lose = 1
        return await real_post(path, body, tally, seconds=seconds)

    api.post = lose_second  # type: ignore[method-assign]
    daemon = carried_daemon(api, _opts(), "rt", "bench-0", time.perf_counter() + 10, st)  # type: ignore[arg-type]
    await asyncio.wait_for(daemon, 5)
    carried = [[c["id"] for c in body.get("complete", [])] for _, body in api.sent]
    assert carried == [[], ["a"], ["a"], ["b"]]
    # Applied twice by the gateway (the same lease: completed again), counted once.
    assert api.applied == {"a": 2, "b": 1}
    assert dict(st.completed) == {"a": 1, "b": 1}
    assert (st.carried_sent, st.carried_acked) == (3, 2)
    assert st.all_done.is_set()


async def test_a_gateway_that_ignores_the_carried_complete_stops_the_drain_unmeasured():
    api = CarryingApi(list("ab"), acks=False)
    st = await _drain(api, "ab")
    assert st.carried_missing and st.stop.is_set() and not st.all_done.is_set()
    assert not st.completed
    # No complete is sent on its own to make up for it: the row is not measured.
    assert all(path.endswith("/claim") for path, _ in api.sent)


async def test_a_task_held_at_the_deadline_is_completed_on_its_own():
    class OneThenLate(CarryingApi):
        async def post(self, path: str, body: Any, tally: Tally, *, seconds: float = 30.0):
            if path.endswith("/complete"):
                self.sent.append((path, body))
                tally.record(200, 0.001, b"")
                return 200, {"id": path.split("/")[3], "status": "completed"}
            got = await super().post(path, body, tally, seconds=seconds)
            await asyncio.sleep(0.3)  # the deadline passes while the task is held
            return got

    api = OneThenLate(list("ab"))
    st = ThroughputState(dict.fromkeys("ab", 0.0))
    daemon = carried_daemon(api, _opts(), "rt", "bench-0", time.perf_counter() + 0.2, st)  # type: ignore[arg-type]
    await asyncio.wait_for(daemon, 5)
    assert [p for p, _ in api.sent] == ["/v1/runtimes/rt/claim", "/v1/tasks/a/complete"]
    assert dict(st.completed) == {"a": 1}
    assert st.completes.statuses[200] == 1


def test_the_session_has_a_connection_per_daemon() -> None:
    opts = argparse.Namespace(pollers=16, max_tasks=1, enqueue_concurrency=2, carried=True)
    assert _connections(opts) >= 16
    separate = argparse.Namespace(pollers=16, max_tasks=1, enqueue_concurrency=2)
    assert _connections(separate) >= 16 * 2
