"""The matrix's unavailability figure (from the first failed write to the first write
sent since then that committed), and its check that writes kept committing while an
old primary rejoined."""

from __future__ import annotations

from tests.faults.checker import Complete, Enqueue, History, Unknown
from tests.faults.matrix import served_through, unavailability

RT = "rt"


def test_it_runs_from_the_first_failed_write_to_the_first_commit_sent_after_it() -> None:
    history = History(
        enqueues=[
            Enqueue("t0", RT, 9.1, 9.0),  # before the fault
            Enqueue("t1", RT, 10.4, 10.3, replayed=True),  # a replay commits nothing
            Enqueue("t2", RT, 15.0, 14.9),
        ],
        completes=[Complete("t0", "l0", 9.8, 16.0)],  # sent before the failure
        unknown=[Unknown("enqueue", RT, 10.0, 14.0), Unknown("claim", RT, 9.5, 10.1)],
    )
    assert unavailability(history, injected=9.9) == 5.0


def test_a_write_sent_before_the_fault_counts_from_the_fault() -> None:
    history = History(
        enqueues=[Enqueue("t1", RT, 13.0, 12.0)],
        unknown=[Unknown("complete", RT, 8.0, 12.0)],
    )
    assert unavailability(history, injected=10.0) == 3.0


def test_the_longest_outage_counts_not_the_first_blip() -> None:
    # A connection cut at 10.0, written again at once (10.1 to 10.2); then the primary
    # stops: writes from 11.0 fail until one sent at 12.9 commits at 13.0.
    history = History(
        enqueues=[Enqueue("t1", RT, 10.2, 10.1), Enqueue("t2", RT, 13.0, 12.9)],
        unknown=[Unknown("enqueue", RT, 10.0, 10.05), Unknown("complete", RT, 11.0, 12.0)],
    )
    assert unavailability(history, injected=9.0) == 2.0


def test_no_failed_write_is_no_unavailability() -> None:
    history = History(unknown=[Unknown("claim", RT, 9.0, 12.0)])
    assert unavailability(history, injected=10.0) is None


def test_a_rejoin_is_served_through_while_commits_keep_coming() -> None:
    history = History(
        enqueues=[Enqueue("t1", RT, 20.5, 20.4), Enqueue("t2", RT, 21.5, 21.4)],
        completes=[Complete("t1", "l1", 22.0, 22.2)],
        unknown=[Unknown("enqueue", RT, 21.0, 21.1)],
    )
    notes: dict[str, str] = {}
    assert served_through(history, 20.0, 23.0, notes) == ""
    assert notes["while the old primary rejoined"] == (
        "3 writes committed, 1 got no usable answer, longest without a commit 1.00 s"
    )


def test_a_rejoin_that_stops_commits_fails_the_row() -> None:
    # Commits before and after the span do not count; inside it, 20.5 to 24.0 is empty.
    history = History(
        enqueues=[Enqueue("t0", RT, 19.0, 18.9), Enqueue("t1", RT, 20.5, 20.4),
                  Enqueue("t2", RT, 25.0, 24.9), Enqueue("t3", RT, 22.0, 21.9, replayed=True)],
    )  # fmt: skip
    problem = served_through(history, 20.0, 24.0, {})
    assert problem.startswith("no write committed for 3.50 s while the old primary rejoined")
