"""The checker finds each kind of failure on a crafted history, and passes a clean one:
a checker that cannot fail checks nothing. The same for the schedules class, over a
crafted tick record and its tasks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.faults.checker import (
    Cancel,
    Claim,
    Complete,
    Enqueue,
    Fail,
    History,
    Lease,
    Row,
    Schedule,
    ScheduledTask,
    Tick,
    Unknown,
    Verdict,
    check,
    check_schedules,
)

RT = "rt"


def _check(history: History, rows: list[Row], checked_at: float = 100.0) -> Verdict:
    return check(history, rows, checked_at=checked_at, janitor_interval=1.0, repair_bound=5.0)


def _delivered(task: str = "t1", lease: str = "l1", at: float = 1.0) -> History:
    """One task enqueued at 0, claimed at `at` and completed right after."""
    return History(
        enqueues=[Enqueue(task, RT, 0.0)],
        claims=[Claim(RT, at - 0.1, at, 10.0, (Lease(task, lease),))],
        completes=[Complete(task, lease, at + 0.1, at + 0.2)],
    )


def test_a_clean_history_passes() -> None:
    verdict = _check(_delivered(), [Row("t1", RT, "completed")])
    assert verdict.clean and verdict.completed_once == {"t1"}


def test_a_task_never_delivered_is_lost() -> None:
    history = History(enqueues=[Enqueue("t1", RT, 0.0)])
    verdict = check(history, [Row("t1", RT, "queued")], checked_at=9.0, janitor_interval=1.0,
                    repair_bound=50.0)  # fmt: skip
    assert set(verdict.lost) == {"t1"}, verdict


def test_a_row_that_vanished_after_its_201_is_acknowledged_lost() -> None:
    verdict = _check(History(enqueues=[Enqueue("t1", RT, 0.0)]), [])
    assert set(verdict.acknowledged_lost) == {"t1"} and not verdict.clean


def test_a_completion_answered_200_then_undone_is_acknowledged_lost() -> None:
    # The primary acknowledged the complete and died; the new primary never had it, and
    # the lease is still running there at the check.
    history = _delivered()
    verdict = _check(history, [Row("t1", RT, "claimed", lease_expires_at=11.0)], checked_at=5.0)
    assert set(verdict.acknowledged_lost) == {"t1"}, verdict
    assert "complete answered 200" in verdict.acknowledged_lost["t1"]
    assert not verdict.clean


def test_a_task_handed_out_again_after_its_completion_is_resurrected() -> None:
    # Completed under l1 (answered at 1.2); the janitor reclaimed the lease the new
    # primary still had and a claim sent at 5 got it; completed again under l2.
    history = _delivered()
    history.claims.append(Claim(RT, 5.0, 5.1, 10.0, (Lease("t1", "l2"),)))
    history.completes.append(Complete("t1", "l2", 5.2, 5.3))
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert set(verdict.resurrected) == {"t1"}, verdict
    assert not verdict.duplicated and not verdict.clean


def test_a_claim_sent_before_the_complete_was_answered_is_no_resurrection() -> None:
    # Sent at 1.15, while the complete (sent 1.1, answered 1.2) was in flight: the two
    # may have raced, so only a claim sent after the 200 accuses.
    history = _delivered()
    history.claims.append(Claim(RT, 1.15, 1.3, 10.0, (Lease("t1", "l2"),)))
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert not verdict.resurrected, verdict


def test_a_task_stuck_claimed_past_lease_and_janitor_is_lost() -> None:
    history = _delivered()
    history.completes.clear()
    verdict = _check(history, [Row("t1", RT, "claimed", lease_expires_at=11.0)], checked_at=12.5)
    assert set(verdict.lost) == {"t1"}


def test_a_live_lease_at_check_time_is_unresolved_not_clean() -> None:
    history = _delivered()
    history.completes.clear()
    verdict = _check(history, [Row("t1", RT, "claimed", lease_expires_at=11.0)], checked_at=11.5)
    assert set(verdict.unresolved) == {"t1"} and not verdict.clean


def test_a_dead_task_is_lost() -> None:
    history = _delivered()
    history.completes.clear()  # with its complete answered 200 it is acknowledged-lost
    verdict = _check(history, [Row("t1", RT, "dead")])
    assert set(verdict.lost) == {"t1"}


def test_a_task_whose_enqueue_had_no_answer_still_counts() -> None:
    history = History(unknown=[Unknown("enqueue", RT, 0.0, 1.0)])
    verdict = _check(history, [Row("t9", RT, "queued")])
    assert set(verdict.lost) == {"t9"}


def test_two_live_leases_at_once_are_a_duplicate() -> None:
    history = _delivered()
    # A second claim hands the task out again while the first lease (10 s) still runs.
    history.claims.append(Claim(RT, 1.5, 1.6, 10.0, (Lease("t1", "l2"),)))
    history.completes[0] = Complete("t1", "l1", 3.0, 3.1)
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert set(verdict.duplicated) == {"t1"}, verdict


def test_a_lease_handed_on_after_the_first_ran_out_is_no_duplicate() -> None:
    history = History(
        enqueues=[Enqueue("t1", RT, 0.0)],
        claims=[
            Claim(RT, 1.0, 1.1, 2.0, (Lease("t1", "l1"),)),  # never completed
            Claim(RT, 4.0, 4.1, 2.0, (Lease("t1", "l2"),)),  # after l1 ran out at >= 3.0
        ],
        completes=[Complete("t1", "l2", 4.2, 4.3)],
    )
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert verdict.clean, verdict


def test_completed_under_two_leases_is_a_duplicate() -> None:
    history = History(
        enqueues=[Enqueue("t1", RT, 0.0)],
        claims=[
            Claim(RT, 1.0, 1.1, 2.0, (Lease("t1", "l1"),)),
            Claim(RT, 4.0, 4.1, 2.0, (Lease("t1", "l2"),)),
        ],
        completes=[Complete("t1", "l2", 4.2, 4.3), Complete("t1", "l1", 5.0, 5.1)],
    )
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert set(verdict.duplicated) == {"t1"}, verdict


def test_an_empty_answer_while_a_task_waited_past_the_bound_is_stale() -> None:
    history = _delivered(at=20.0)
    history.claims.append(Claim(RT, 8.0, 10.0, 10.0))  # empty at 10: t1 waited 10 s > 5 s
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert len(verdict.stale_empty) == 1, verdict


def test_an_empty_answer_within_the_bound_is_fine() -> None:
    history = _delivered(at=20.0)
    history.claims.append(Claim(RT, 2.0, 4.0, 10.0))  # t1 waited only 4 s
    history.claims.append(Claim("other", 8.0, 10.0, 10.0))  # another runtime's
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert verdict.clean, verdict


def test_a_claim_with_no_answer_excuses_a_later_empty_answer() -> None:
    history = _delivered(at=20.0)
    history.unknown.append(Unknown("claim", RT, 2.0, 3.0))  # it may have taken t1
    history.claims.append(Claim(RT, 8.0, 10.0, 10.0))
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert verdict.clean, verdict


def _failed_then_reclaimed() -> History:
    """t1 claimed at 1 (10 s lease), failed with retry at 2, claimed again at 4 while
    the first lease's time has not run out, completed under the second lease."""
    return History(
        enqueues=[Enqueue("t1", RT, 0.0)],
        claims=[
            Claim(RT, 0.9, 1.0, 10.0, (Lease("t1", "l1"),)),
            Claim(RT, 3.9, 4.0, 10.0, (Lease("t1", "l2"),)),
        ],
        fails=[Fail("t1", "l1", 2.0, 2.1)],
        completes=[Complete("t1", "l2", 4.5, 4.6)],
    )


def test_a_failed_then_reclaimed_task_is_not_duplicated() -> None:
    verdict = _check(_failed_then_reclaimed(), [Row("t1", RT, "completed")])
    assert verdict.clean and verdict.completed_once == {"t1"}, verdict


def test_without_its_fail_the_same_history_is_two_live_leases() -> None:
    history = _failed_then_reclaimed()
    history.fails.clear()
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert set(verdict.duplicated) == {"t1"}, verdict


def test_a_failed_task_never_completed_is_lost() -> None:
    history = _failed_then_reclaimed()
    history.completes.clear()
    history.claims.pop()
    verdict = _check(history, [Row("t1", RT, "queued")])
    assert set(verdict.lost) == {"t1"}, verdict


def test_a_task_cancelled_by_a_cancel_answered_200_is_cancelled_not_lost() -> None:
    history = History(enqueues=[Enqueue("t1", RT, 0.0)], cancels=[Cancel("t1", 0.5, 0.6)])
    # Empty answers long after: the cancel ended its claimable window, so none is stale.
    history.claims.append(Claim(RT, 8.0, 10.0, 10.0))
    verdict = _check(history, [Row("t1", RT, "cancelled")])
    assert verdict.clean and verdict.cancelled == {"t1"}, verdict


def test_a_cancelled_task_whose_complete_won_is_completed() -> None:
    history = _delivered()
    history.cancels.append(Cancel("t1", 1.15, 1.3))
    verdict = _check(history, [Row("t1", RT, "completed")])
    assert verdict.clean and verdict.completed_once == {"t1"}, verdict


def test_a_cancel_with_no_answer_excuses_a_cancelled_row() -> None:
    history = History(enqueues=[Enqueue("t1", RT, 0.0)])
    history.unknown.append(Unknown("cancel", RT, 0.5, 4.5, task_id="t1"))
    verdict = _check(history, [Row("t1", RT, "cancelled")])
    assert verdict.clean and verdict.cancelled == {"t1"}, verdict


def test_a_cancelled_row_nobody_cancelled_is_lost() -> None:
    verdict = _check(History(enqueues=[Enqueue("t1", RT, 0.0)]), [Row("t1", RT, "cancelled")])
    assert set(verdict.lost) == {"t1"}, verdict


def test_a_task_a_schedule_made_is_left_to_the_schedules_class() -> None:
    # No producer's answer names it, and it may still be queued at the check.
    rows = [Row("t1", RT, "completed"), Row("s1", "rt-ticks", "queued", schedule="every")]
    verdict = _check(_delivered(), rows)
    assert verdict.clean and verdict.completed_once == {"t1"}, verdict


# -- the schedules class ---------------------------------------------------------------

T0 = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)
EVERY = Schedule(1, "rt-ticks", "every", T0, every_seconds=1)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _enqueued(seconds: int, schedule: Schedule = EVERY) -> tuple[Tick, ScheduledTask]:
    """Tick `seconds` after T0 recorded enqueued, and its task."""
    task_id = f"{schedule.name}-{seconds}"
    return (
        Tick(schedule.schedule_id, _at(seconds), "enqueued", task_id),
        ScheduledTask(task_id, schedule.runtime, schedule.name, _at(seconds)),
    )


def _every_tick(count: int) -> tuple[list[Tick], list[ScheduledTask]]:
    """Ticks 0 to count - 1 each enqueued with its task."""
    made = [_enqueued(n) for n in range(count)]
    return [tick for tick, _ in made], [task for _, task in made]


def test_every_due_tick_with_its_task_or_a_recorded_skip_is_clean() -> None:
    ticks, tasks = _every_tick(5)
    ticks[2] = Tick(1, _at(2), "skipped_overlap")
    ticks[3] = Tick(1, _at(3), "skipped_late")
    del tasks[2:4]
    verdict = check_schedules([EVERY], ticks, tasks, until=_at(4.5))
    assert verdict.clean, verdict.problems()
    assert verdict.due == 5
    assert verdict.outcomes == {"enqueued": 3, "skipped_overlap": 1, "skipped_late": 1}
    assert verdict.skipped == 2


def test_a_tick_with_two_tasks_is_duplicated() -> None:
    ticks, tasks = _every_tick(3)
    tasks.append(ScheduledTask("second", "rt-ticks", "every", _at(1)))
    verdict = check_schedules([EVERY], ticks, tasks, until=_at(2))
    assert list(verdict.duplicated) == [f"rt-ticks/every@{_at(1).isoformat()}"], verdict
    assert "2 tasks" in verdict.duplicated[f"rt-ticks/every@{_at(1).isoformat()}"]
    assert not verdict.clean


def test_a_tick_recorded_twice_is_duplicated_even_past_the_cut_off() -> None:
    # Without the tick key a second decision adds a row (and a task): the record shows
    # it whether or not the tick is due by the cut-off.
    ticks, tasks = _every_tick(4)
    again, its_task = _enqueued(3)
    ticks.append(Tick(1, _at(3), "enqueued", "again"))
    tasks.append(ScheduledTask("again", its_task.runtime, its_task.schedule, _at(3)))
    verdict = check_schedules([EVERY], ticks, tasks, until=_at(2))
    assert set(verdict.duplicated) == {f"rt-ticks/every@{again.tick_at.isoformat()}"}, verdict


def test_a_due_tick_with_neither_task_nor_skip_is_a_silent_gap() -> None:
    ticks, tasks = _every_tick(5)
    del ticks[3], tasks[3]
    verdict = check_schedules([EVERY], ticks, tasks, until=_at(4))
    assert list(verdict.gaps) == [f"rt-ticks/every@{_at(3).isoformat()}"], verdict
    assert not verdict.clean


def test_ticks_after_the_cut_off_or_before_the_first_are_not_due() -> None:
    ticks, tasks = _every_tick(3)
    late_starter = Schedule(2, "rt-ticks", "later", _at(10), every_seconds=1)
    verdict = check_schedules([EVERY, late_starter], ticks, tasks, until=_at(2.9))
    assert verdict.clean and verdict.due == 3, verdict.problems()


def test_the_record_and_the_tasks_must_agree() -> None:
    ticks, tasks = _every_tick(4)
    tasks = [t for t in tasks if t.scheduled_for != _at(0)]  # enqueued, its task missing
    ticks = [t for t in ticks if t.tick_at != _at(1)]  # a task, no tick row
    ticks[-1] = Tick(1, _at(3), "skipped_overlap")  # skipped, yet its task was made
    verdict = check_schedules([EVERY], ticks, tasks, until=_at(3))
    assert set(verdict.unmatched) == {f"rt-ticks/every@{_at(n).isoformat()}" for n in (0, 1, 3)}, (
        verdict
    )
    assert not verdict.gaps and not verdict.duplicated and not verdict.clean


def test_a_cron_is_read_by_the_gateways_own_timing() -> None:
    # Every 2 s (6 fields, seconds first): the odd seconds are no ticks, so leaving them
    # out is no gap, and T0 + 4 missing is one.
    every_two = Schedule(3, "rt-cron", "two", T0, cron="*/2 * * * * *")
    made = [_enqueued(n, every_two) for n in (0, 2, 6)]
    ticks, tasks = [t for t, _ in made], [t for _, t in made]
    verdict = check_schedules([every_two], ticks, tasks, until=_at(7))
    assert verdict.due == 4
    assert list(verdict.gaps) == [f"rt-cron/two@{_at(4).isoformat()}"], verdict


def test_a_duplicate_and_a_gap_together_are_both_reported() -> None:
    """The class can fail: what the tick key dropped from a real run looks like (a
    tick decided twice), beside a tick a pass passed over."""
    ticks, tasks = _every_tick(6)
    ticks.append(Tick(1, _at(2), "enqueued", "twice"))
    tasks.append(ScheduledTask("twice", "rt-ticks", "every", _at(2)))
    del ticks[4], tasks[4]
    verdict = check_schedules([EVERY], ticks, tasks, until=_at(5))
    assert len(verdict.duplicated) == 1 and len(verdict.gaps) == 1, verdict
    assert len(verdict.problems()) == 2 and not verdict.clean
