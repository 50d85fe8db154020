"""The drain's batch acknowledgement: what it sends, what it counts, and a missing endpoint."""

from __future__ import annotations

import argparse
from typing import Any

from bench.client import Tally
from bench.scenarios import ThroughputState, _complete_batch, _connections


class FakeApi:
    """Records each POST and answers with the canned (status, body)."""

    def __init__(self, status: int, body: Any) -> None:
        self.answer = (status, body)
        self.sent: list[tuple[str, Any]] = []

    async def post(self, path: str, body: Any, tally: Tally, *, seconds: float = 30.0) -> Any:
        self.sent.append((path, body))
        tally.record(self.answer[0], 0.001, b"")
        return self.answer


def _state(ids: list[str]) -> ThroughputState:
    return ThroughputState({i: 0.0 for i in ids})


async def test_one_request_per_batch_and_only_completed_outcomes_count() -> None:
    st = _state(["a", "b", "c"])
    api = FakeApi(
        200,
        {
            "results": [
                {"id": "a", "outcome": "completed"},
                {"id": "b", "outcome": "lease_lost", "problem": {}},
            ]
        },
    )
    tasks = [{"id": "a", "lease_id": "la"}, {"id": "b", "lease_id": "lb"}]
    await _complete_batch(api, tasks, 0.0, st)  # type: ignore[arg-type]
    assert api.sent == [
        (
            "/v1/tasks:complete",
            {
                "tasks": [
                    {"id": "a", "lease_id": "la", "result": {"ok": True}},
                    {"id": "b", "lease_id": "lb", "result": {"ok": True}},
                ]
            },
        )
    ]
    assert dict(st.completed) == {"a": 1}
    assert dict(st.ack_outcomes) == {"completed": 1, "lease_lost": 1}
    assert dict(st.delivered) == {"a": 1, "b": 1}
    assert not st.all_done.is_set()


async def test_a_404_marks_the_endpoint_missing_and_stops_the_drain() -> None:
    st = _state(["a"])
    await _complete_batch(FakeApi(404, None), [{"id": "a", "lease_id": "la"}], 0.0, st)  # type: ignore[arg-type]
    assert st.batch_ack_missing
    assert st.stop.is_set()
    assert not st.completed


async def test_the_last_completion_ends_the_drain() -> None:
    st = _state(["a"])
    api = FakeApi(200, {"results": [{"id": "a", "outcome": "completed"}]})
    await _complete_batch(api, [{"id": "a", "lease_id": "la"}], 0.0, st)  # type: ignore[arg-type]
    assert st.all_done.is_set() and st.stop.is_set()


def test_the_session_has_room_for_every_request_a_daemon_has_in_flight() -> None:
    # A claimed batch's completes are sent at once: with fewer connections they would
    # queue in the load generator, and the gateway would never see them together.
    single = argparse.Namespace(pollers=16, max_tasks=10, enqueue_concurrency=2)
    assert _connections(single) >= 16 * (1 + 10)
    batch = argparse.Namespace(pollers=16, max_tasks=10, enqueue_concurrency=2, batch_ack=True)
    assert _connections(batch) >= 16 * 2
    many_enqueuers = argparse.Namespace(pollers=1, max_tasks=1, enqueue_concurrency=50)
    assert _connections(many_enqueuers) >= 50
