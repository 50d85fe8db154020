"""Validation of a runtime controls change, and the per-process copy's bookkeeping
(what counts as a change, which runtimes a freed slot wakes), over fakes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.api.render import pause_json
from gateway.api.requests import parse_controls, parse_pause
from gateway.claim.controls import RuntimeControls
from gateway.errors import ValidationFailed
from gateway.rows import Controls, ControlsChange, LimitedClaim
from gateway.store.controls import refill_wait_seconds
from tests.support.waiting import wait_until


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": 100_001}, "max_in_flight"),
        ({"max_in_flight": 2.5}, "max_in_flight"),
        ({"max_in_flight": "3"}, "max_in_flight"),
        ({"max_in_flight": True}, "max_in_flight"),
        ({"claims_per_second": 0}, "claims_per_second"),
        ({"claims_per_second": -1}, "claims_per_second"),
        ({"claims_per_second": 100_000.01}, "claims_per_second"),
        ({"claims_per_second": "fast"}, "claims_per_second"),
        ({"paused": None}, "paused"),
        ({"paused": 1}, "paused"),
        ({"max_inflight": 3}, "max_inflight"),
        ({}, "body"),
    ],
)
def test_bad_values_name_their_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_controls(body)
    assert caught.value.extra["field"] == field


def test_a_body_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValidationFailed):
        parse_controls([{"paused": True}])


def test_fields_left_out_are_left_as_they_are_and_null_removes_a_limit() -> None:
    assert parse_controls({"paused": True}) == ControlsChange(paused=True)
    assert parse_controls({"max_in_flight": None}) == ControlsChange(sets_max_in_flight=True)
    change = parse_controls({"max_in_flight": 100_000, "claims_per_second": 0.5})
    assert change == ControlsChange(
        max_in_flight=100_000,
        claims_per_second=0.5,
        sets_max_in_flight=True,
        sets_claims_per_second=True,
    )


def test_refill_wait() -> None:
    assert refill_wait_seconds(0.5, 2.0) == pytest.approx(0.25)
    assert refill_wait_seconds(0.0, 10.0) == pytest.approx(0.1)


class FakeStore:
    def __init__(self) -> None:
        self.rows: dict[str, Controls] = {}

    async def all_controls(self) -> list[Controls]:
        return list(self.rows.values())

    async def get_controls(self, runtime_id: str) -> Controls | None:
        return self.rows.get(runtime_id)

    async def set_controls(self, runtime_id: str, change: ControlsChange) -> Controls:
        old = self.rows.get(runtime_id) or Controls(runtime_id)
        new = Controls(
            runtime_id,
            old.paused if change.paused is None else change.paused,
            change.max_in_flight if change.sets_max_in_flight else old.max_in_flight,
            change.claims_per_second if change.sets_claims_per_second else old.claims_per_second,
            paused_reason=change.paused_reason,
            paused_until=change.paused_until,
        )
        self.rows[runtime_id] = new
        return new

    async def claim_limited(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> LimitedClaim:
        return LimitedClaim([], None, None)


class FakeCache:
    def __init__(self) -> None:
        self.published: list[str] = []
        self.woken: list[list[str]] = []

    async def publish_control(self, message: str) -> None:
        self.published.append(message)

    async def wake(self, runtime_ids: list[str]) -> None:
        self.woken.append(runtime_ids)


async def test_changes_are_applied_published_and_reported_once() -> None:
    store, cache, changed = FakeStore(), FakeCache(), []
    controls = RuntimeControls(store, cache, changed.append)
    await controls.change("a", ControlsChange(paused=True))
    assert controls.paused("a") and not controls.limited("a")
    assert cache.published == ["controls:a"] and changed == ["a"]
    await controls.change("a", ControlsChange(paused=True))  # no change: nobody woken
    assert changed == ["a"]
    await controls.change("a", ControlsChange(paused=False))
    assert not controls.paused("a") and changed == ["a", "a"]
    # Another instance's change arrives as a row in Postgres and a refresh.
    store.rows["b"] = Controls("b", max_in_flight=2)
    await controls.refresh()
    assert controls.limited("b") and changed[-1] == "b"
    del store.rows["b"]
    await controls.refresh()
    assert not controls.limited("b")


async def test_a_freed_slot_wakes_only_runtimes_with_a_max_in_flight() -> None:
    store, cache, changed = FakeStore(), FakeCache(), []
    controls = RuntimeControls(store, cache, changed.append)
    await controls.change("limited", ControlsChange(max_in_flight=1, sets_max_in_flight=True))
    await controls.change(
        "rated", ControlsChange(claims_per_second=1.0, sets_claims_per_second=True)
    )
    changed.clear()
    await controls.slot_freed(["free", "rated"])
    assert cache.woken == [] and changed == []
    await controls.slot_freed(["limited", "free", "limited"])
    assert cache.woken == [["limited"]] and changed == ["limited"]


async def test_an_older_read_never_replaces_a_newer_one() -> None:
    """Two reloads of one runtime race: the pause read first arrives after the resume."""
    store, cache, changed = FakeStore(), FakeCache(), []
    controls = RuntimeControls(store, cache, changed.append)
    now = datetime.now(UTC)
    store.rows["a"] = Controls("a", paused=False, updated_at=now)
    await controls.refresh()
    store.rows["a"] = Controls("a", paused=True, updated_at=now - timedelta(seconds=1))
    await controls.refresh()
    assert not controls.paused("a")


def test_a_pause_body_is_optional_and_until_must_be_ahead() -> None:
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert parse_pause({}, now) == ControlsChange(paused=True)
    change = parse_pause({"reason": "r", "until": "2026-11-26T12:00:01Z"}, now)
    assert (change.paused_reason, change.paused_until) == ("r", now + timedelta(seconds=1))
    for body, field in (
        ({"until": "2026-11-26T12:00:00Z"}, "until"),
        ({"until": "2026-11-26T13:00:00"}, "until"),
        ({"reason": "x" * 501}, "reason"),
        ({"why": "x"}, "why"),
        ("x", "body"),
    ):
        with pytest.raises(ValidationFailed) as caught:
            parse_pause(body, now)
        assert caught.value.extra["field"] == field, body


def test_a_pause_past_its_end_reads_as_not_paused() -> None:
    now = datetime.now(UTC)
    ended = Controls("a", paused=True, paused_reason="r", paused_until=now - timedelta(seconds=1))
    assert not ended.paused_now()
    assert pause_json(ended) == {
        "paused": False,
        "paused_reason": None,
        "paused_since": None,
        "paused_until": None,
    }
    assert Controls("a", paused=True, paused_until=now + timedelta(hours=1)).paused_now()


async def test_the_end_of_a_pause_wakes_the_runtime_once() -> None:
    """The per-process timer: no reload, no message; the runtime is reported changed
    once its pause ends, and a resume before the end cancels the timer."""
    store, cache, changed = FakeStore(), FakeCache(), []
    controls = RuntimeControls(store, cache, changed.append)
    soon = datetime.now(UTC) + timedelta(seconds=0.2)
    await controls.change("a", ControlsChange(paused=True, paused_until=soon))
    await controls.change("b", ControlsChange(paused=True, paused_until=soon))
    await controls.change("b", ControlsChange(paused=False))
    changed.clear()
    assert controls.paused("a")
    await wait_until(lambda: changed == ["a"], 5, "the end of a's pause")
    assert not controls.paused("a")
    await asyncio.sleep(0.3)  # b's cancelled timer would have fired by now
    assert changed == ["a"]
    await controls.stop()
