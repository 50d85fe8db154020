"""The checker finds each kind of failure on a crafted history, and passes a clean one:
a checker that cannot fail checks nothing."""

from __future__ import annotations

from tests.faults.checker import (
    Cancel,
    Claim,
    Complete,
    Enqueue,
    Fail,
    History,
    Lease,
    Row,
    Unknown,
    Verdict,
    check,
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
