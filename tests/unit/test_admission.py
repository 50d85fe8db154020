"""The line for a database connection (gateway/admission.py): releases go before the
work that waits; work that would wait past its budget is refused at once; nothing is
refused while the line is short; and a slot is never lost, whatever ends a wait."""

from __future__ import annotations

import asyncio

import pytest

from gateway import admission as adm
from gateway.admission import Admission, Caller, Priority, caller, priority, releasing
from gateway.errors import ClientGone, DatabaseBusy
from gateway.metrics import Metrics
from tests.support.metrics import sample


def admission(slots: int = 1, budget_ms: float = 100.0, timeout_ms: float = 2_000.0) -> Admission:
    return Admission(slots, budget_ms, timeout_ms, Metrics())


async def take(line: Admission, wanted: Priority, order: list[str], name: str) -> int:
    token = priority.set(wanted)
    try:
        granted = await line.acquire()
    finally:
        priority.reset(token)
    order.append(name)
    return granted


async def test_releases_go_before_work_that_waited_longer() -> None:
    line = admission(slots=1)
    first = await line.acquire()
    order: list[str] = []
    work = asyncio.create_task(take(line, Priority.WORK, order, "work"))
    await asyncio.sleep(0)
    done = asyncio.create_task(take(line, Priority.RELEASE, order, "release"))
    await asyncio.sleep(0)
    line.release(first)
    line.release(await done)
    line.release(await work)
    assert order == ["release", "work"]


async def test_work_that_waited_a_tenth_of_its_budget_goes_before_later_releases() -> None:
    """Releases are never refused: under a flood of completes each slot would go to the
    newest release, and work let in for a wait within its budget would wait for as
    long as the flood lasts. Once the oldest work has waited a tenth of its budget
    (STANDING_SHARE), it is next."""
    line = admission(slots=1, budget_ms=500.0)  # a tenth: 50 ms
    held = await line.acquire()
    order: list[str] = []
    work = asyncio.create_task(take(line, Priority.WORK, order, "work"))
    await asyncio.sleep(0)
    early = asyncio.create_task(take(line, Priority.RELEASE, order, "early release"))
    await asyncio.sleep(0)
    # Within the tenth (50 ms), the release goes first.
    line.release(held)
    line.release(await early)
    line.release(await work)
    assert order == ["early release", "work"]
    # Now the work waits past the tenth while releases keep arriving.
    held = await line.acquire()
    order.clear()
    work = asyncio.create_task(take(line, Priority.WORK, order, "work"))
    await asyncio.sleep(0.06)  # past 50 ms
    late = [
        asyncio.create_task(take(line, Priority.RELEASE, order, f"release {k}")) for k in range(3)
    ]
    await asyncio.sleep(0)
    line.release(held)
    line.release(await work)
    for release in late:
        line.release(await release)
    assert order == ["work", "release 0", "release 1", "release 2"]
    assert line.load().held == 0


async def test_work_past_its_budget_is_refused_at_once_releases_wait() -> None:
    line = admission(slots=2, budget_ms=50.0)
    line.hold_ms = 80.0  # each connection is held 80 ms on average (and not longer yet)
    held = [await line.acquire(), await line.acquire()]
    # First in line: (0 + 1) / 2 slots x 80 ms = 40 ms, within the budget.
    queued = asyncio.create_task(take(line, Priority.WORK, [], "queued"))
    await asyncio.sleep(0)
    # Second: 2 / 2 x 80 = 80 ms, past it.
    with pytest.raises(DatabaseBusy) as refused:
        await take(line, Priority.WORK, [], "refused")
    assert "GATEWAY_DB_QUEUE_BUDGET_MS" in refused.value.detail
    assert sample(line._metrics, "gateway_shed_total", reason="database_queue") == 1
    # A release is never shed: it waits (and goes first).
    with releasing():
        release = asyncio.create_task(line.acquire())
    await asyncio.sleep(0)
    assert not release.done()
    for granted in held:
        line.release(granted)
    line.release(await release)
    line.release(await queued)
    assert line.expected_wait_ms(Priority.WORK) == 0.0


async def test_nothing_is_refused_while_the_line_is_short() -> None:
    line = admission(slots=4, budget_ms=5_000.0)
    line.hold_ms = 50.0
    held = [await line.acquire() for _ in range(4)]
    waiting = [asyncio.create_task(take(line, Priority.WORK, [], str(i))) for i in range(40)]
    await asyncio.sleep(0)
    # 40 waiters x 50 ms / 4 slots = 500 ms: all within the budget (and so they stay
    # however slowly a loaded machine runs this: the current holds would have to be
    # older than half a second).
    assert not any(w.done() for w in waiting)
    for granted in held:
        line.release(granted)
    for w in waiting:
        line.release(await w)
    assert line.queue_limit() == pytest.approx(5_000.0 / line.hold_ms * 4)


async def test_a_wait_ends_at_the_timeout_and_a_cancelled_wait_loses_no_slot() -> None:
    line = admission(slots=1, timeout_ms=50.0)
    first = await line.acquire()
    with pytest.raises(DatabaseBusy) as late:
        await line.acquire()
    assert "GATEWAY_DB_ACQUIRE_TIMEOUT_MS" in late.value.detail
    assert sample(line._metrics, "gateway_db_acquire_timeouts_total") == 1
    cancelled = asyncio.create_task(line.acquire())
    await asyncio.sleep(0)
    cancelled.cancel()
    # Granted in the same turn as it is cancelled: the slot goes on, not lost.
    granted_then_cancelled = asyncio.create_task(line.acquire())
    await asyncio.sleep(0)
    line.release(first)
    granted_then_cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    with pytest.raises(asyncio.CancelledError):
        await granted_then_cancelled
    # Every slot came back: one acquire succeeds at once, a second must wait.
    again = await asyncio.wait_for(line.acquire(), 1)
    blocked = asyncio.create_task(line.acquire())
    await asyncio.sleep(0.01)
    assert not blocked.done()
    line.release(again)
    line.release(await blocked)


async def test_each_wait_ends_at_its_own_timeout_with_one_timer_for_the_line() -> None:
    """Waits that joined at different times, in both lines, each end at their own
    acquire timeout (not at an earlier one's, nor a whole timeout late); the line
    keeps one timer however many wait."""
    line = admission(slots=1, budget_ms=10_000.0, timeout_ms=300.0)
    held = await line.acquire()
    loop = asyncio.get_running_loop()
    order: list[str] = []

    async def ends(wanted: Priority, name: str) -> float:
        with pytest.raises(DatabaseBusy):
            await take(line, wanted, order, name)
        return loop.time()

    started = loop.time()
    first = [asyncio.create_task(ends(Priority.WORK, f"work {n}")) for n in range(3)]
    await asyncio.sleep(0.15)
    later = asyncio.create_task(ends(Priority.RELEASE, "release"))
    await asyncio.sleep(0)
    assert line._timer is not None and len(line._joined) == 4
    ended_first = await asyncio.gather(*first)
    assert line._timer is not None  # armed again, for the release's wait
    ended_later = await later
    for ended in ended_first:
        assert 0.29 <= ended - started < 0.42, ended - started
    assert 0.44 <= ended_later - started < 0.6, ended_later - started
    assert sample(line._metrics, "gateway_db_acquire_timeouts_total") == 4
    assert line._timer is None and not line._joined and order == []
    # The slot was never lost: it goes to the next request once given back.
    line.release(held)
    line.release(await asyncio.wait_for(line.acquire(), 1))


def test_outside_a_request_the_gateways_own_work_goes_first() -> None:
    assert priority.get() is Priority.RELEASE


def test_each_endpoint_has_its_place_in_the_line() -> None:
    """Work (enqueues, webhooks, reads) is shed, on arrival; the claim is work but never
    refused on arrival (an empty verdict needs no database); operations on claimed tasks,
    an operator's controls and administration, the probes and the metrics go first and
    are never shed."""
    from gateway.http.routes import ENDPOINTS

    place = {(e.method, e.path): (e.priority, e.refused_early) for e in ENDPOINTS}
    work, first = (Priority.WORK, True), (Priority.RELEASE, False)
    for path in ("/v1/runtimes/{rt}/tasks", "/v1/runtimes/{rt}/tasks:batch"):
        assert place["POST", path] == work
    assert place["POST", "/v1/runtimes/{rt}/webhooks"] == work
    assert place["GET", "/v1/tasks/{task_id}"] == work
    assert place["GET", "/v1/runtimes/{rt}/stats"] == work
    assert place["POST", "/v1/runtimes/{rt}/claim"] == (Priority.WORK, False)
    for op in ("complete", "fail", "heartbeat", "release"):
        assert place["POST", f"/v1/tasks/{{task_id}}/{op}"] == first
    for op in ("complete", "fail", "heartbeat"):
        assert place["POST", f"/v1/tasks:{op}"] == first
    # The instance's load is read from memory: it is wanted most while the line is full.
    assert place["GET", "/v1/instance/load"] == first
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/admin/tokens"):
        assert place["GET", path] == first
    controls = [("POST", f"/v1/runtimes/{{rt}}:{op}") for op in ("pause", "resume")]
    assert all(place[key] == first for key in controls)
    # Schedules are a producer's work: managed as enqueues are, read as reads are.
    schedules = [key for key in place if "/schedules" in key[1]]
    assert schedules and all(place[key] == work for key in schedules)


async def test_a_token_is_loaded_as_a_release_whoever_asks_first() -> None:
    """One load serves every request of the token, of whatever kind: it is never shed
    for the first one's sake (and never fails a complete with it)."""
    from gateway.auth.principals import LocalCache

    seen: list[Priority] = []

    async def load(key: str) -> str:
        seen.append(priority.get())
        return key

    cache: LocalCache[str, str] = LocalCache(60.0, 10)
    token = priority.set(Priority.WORK)
    try:
        assert await cache.get("k", load) == "k"
    finally:
        priority.reset(token)
    assert seen == [Priority.RELEASE]


async def take_for(line: Admission, who: Caller, wanted: Priority = Priority.WORK) -> int:
    """acquire() as a request of `wanted` on the connection `who` makes it."""
    tokens = priority.set(wanted), caller.set(who)
    try:
        return await line.acquire()
    finally:
        caller.reset(tokens[1])
        priority.reset(tokens[0])


async def test_work_whose_client_left_leaves_the_line_and_is_never_granted() -> None:
    line = admission(slots=1, budget_ms=60_000.0)
    first = await line.acquire()
    gone, staying, release_gone = Caller(), Caller(), Caller()
    leaving = asyncio.create_task(take_for(line, gone))
    behind = asyncio.create_task(take_for(line, staying))
    complete = asyncio.create_task(take_for(line, release_gone, Priority.RELEASE))
    await asyncio.sleep(0)
    assert line.load().waiting_work == 2
    gone.leave()
    release_gone.leave()
    # Its wait ends at once, while the slot is still held.
    with pytest.raises(ClientGone):
        await asyncio.wait_for(leaving, 1)
    assert sample(line._metrics, "gateway_shed_total", reason="client_gone") == 1
    assert line.load().waiting_work == 1
    assert line.refusals.last_minute() == {"client_gone": 1}
    # A release whose client left is granted all the same (a sent complete is applied).
    line.release(first)
    line.release(await asyncio.wait_for(complete, 1))
    line.release(await asyncio.wait_for(behind, 1))
    # Work arriving after its client left is refused before it waits, even with a
    # slot free.
    with pytest.raises(ClientGone):
        await take_for(line, gone)
    assert sample(line._metrics, "gateway_shed_total", reason="client_gone") == 2


async def test_a_slot_granted_as_its_client_leaves_goes_on() -> None:
    line = admission(slots=1, budget_ms=60_000.0)
    first = await line.acquire()
    gone = Caller()
    leaving = asyncio.create_task(take_for(line, gone))
    after = asyncio.create_task(take_for(line, Caller()))
    await asyncio.sleep(0)
    line.release(first)  # granted to `leaving`, which has not run yet
    gone.leave()
    with pytest.raises(ClientGone):
        await leaving
    line.release(await asyncio.wait_for(after, 1))
    assert line.load().held == 0


async def test_a_line_that_stood_an_interval_lets_work_in_for_a_tenth_of_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CoDel's judgement: work granted after waiting past a tenth of the budget, again
    and again for STANDING_INTERVAL_SECONDS, makes the line standing; a newcomer whose
    expected wait is within the budget but past that tenth is then refused. Before
    the interval is out, the same newcomer is let in (a burst waits its turn); a grant
    that waited less does not end it, a line with no work left does once calm."""
    monkeypatch.setattr(adm, "STANDING_CALM_SECONDS", 0.05)
    line = admission(slots=1, budget_ms=2_000.0)  # a tenth: 200 ms
    held = await line.acquire()
    waiting = [asyncio.create_task(take(line, Priority.WORK, [], str(i))) for i in range(12)]
    await asyncio.sleep(0.25)  # past the tenth, within the budget
    line.release(held)
    first = await waiting[0]  # waited 250 ms: above since now
    assert not line.standing

    def newcomer_fits_the_budget_only() -> None:
        # 11 waiting and the newcomer: 12 x 40 ms = 480 ms, between 200 and 2,000 (a
        # stall of up to 80 ms on a loaded machine leaves it there: the newest hold's
        # age counts once it is older than the mean).
        line.hold_ms = 40.0
        assert 200.0 < line.expected_wait_ms(Priority.WORK) < 2_000.0

    newcomer_fits_the_budget_only()
    early = asyncio.create_task(take(line, Priority.WORK, [], "early"))
    await asyncio.sleep(0)
    assert not early.done()  # let in: the line has not stood an interval yet
    await asyncio.sleep(adm.STANDING_INTERVAL_SECONDS)
    line.release(first)
    second = await waiting[1]  # waited past the tenth an interval after the first
    assert line.standing and line.load().standing
    line.hold_ms = 40.0
    assert line.queue_limit() <= 200.0 / 40.0
    newcomer_fits_the_budget_only()
    with pytest.raises(DatabaseBusy):
        await take(line, Priority.WORK, [], "refused")
    assert line.crowded()
    # A grant that waited less does not end it while work still waits.
    line.release(second)
    third = await waiting[2]
    line.release(third)
    fourth = await waiting[3]
    assert line.standing
    # Drained: no work left waiting, and once calm the line stands no more.
    line.release(fourth)
    for w in [*waiting[4:], early]:
        line.release(await w)
    await asyncio.sleep(adm.STANDING_CALM_SECONDS)
    assert not line.standing and not line.crowded()


@pytest.mark.parametrize(("each_waits", "stands"), [(0.02, False), (0.08, True)])
async def test_only_grants_that_waited_past_the_tenth_for_an_interval_make_a_line_stand(
    each_waits: float, stands: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests of work always in line (it never drains); each is granted after
    `each_waits` seconds, for longer than the interval: under the tenth (50 ms) the
    line never stands, past it it does."""
    monkeypatch.setattr(adm, "STANDING_CALM_SECONDS", 0.05)
    line = admission(slots=1, budget_ms=500.0)
    held = await line.acquire()
    queued = [asyncio.create_task(take(line, Priority.WORK, [], str(i))) for i in range(2)]
    for _ in range(4):
        await asyncio.sleep(each_waits)
        line.release(held)
        held = await queued.pop(0)
        line.hold_ms = 1.0  # the newcomer is let in whatever the holds were
        queued.append(asyncio.create_task(take(line, Priority.WORK, [], "next")))
        await asyncio.sleep(0)
    assert line.standing is stands
    line.release(held)
    for task in queued:
        line.release(await task)
    await asyncio.sleep(adm.STANDING_CALM_SECONDS)
    assert not line.standing


async def test_a_line_emptied_by_leaving_clients_stands_no_more_once_calm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Work that leaves the line (its client gone, its timeout) ends standing with it
    once calm, though no grant drained the line: releases keeping every connection
    busy do not keep work refused at the tenth."""
    monkeypatch.setattr(adm, "STANDING_CALM_SECONDS", 0.05)
    line = admission(slots=1, budget_ms=500.0)
    held = await line.acquire()
    callers = [Caller() for _ in range(4)]

    async def wait_as(who: Caller) -> int:
        token = caller.set(who)
        try:
            return await take(line, Priority.WORK, [], "work")
        finally:
            caller.reset(token)

    queued = [asyncio.create_task(wait_as(c)) for c in callers]
    for _ in range(2):
        await asyncio.sleep(0.08)
        line.release(held)
        held = await queued.pop(0)
    await asyncio.sleep(0.08)
    line.release(held)
    held = await queued.pop(0)
    assert line.standing
    callers[-1].leave()
    await asyncio.gather(*queued, return_exceptions=True)
    assert line.load().waiting_work == 0
    assert line.standing  # not calm yet: the last grant waited past the tenth
    await asyncio.sleep(adm.STANDING_CALM_SECONDS)
    assert not line.standing
    line.release(held)


async def standing_line() -> tuple[Admission, int]:
    """A line (one slot, a tenth of its budget 50 ms) that CoDel's judgement has just
    found standing, and the slot's grant, with no work left waiting."""
    line = admission(slots=1, budget_ms=500.0)
    held = await line.acquire()
    queued = [asyncio.create_task(take(line, Priority.WORK, [], str(i))) for i in range(3)]
    for _ in range(3):
        await asyncio.sleep(0.08)  # each waits past the tenth
        line.release(held)
        held = await queued.pop(0)
    assert line.standing
    return line, held


async def test_a_line_that_empties_for_a_moment_under_a_flood_stands_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flood whose refused clients come back together leaves the line empty for a
    moment now and then: it stands on through that, and the next wave is let in for
    the tenth, not the whole budget; once STANDING_CALM_SECONDS have passed since it
    was last found standing, the same wave is let in."""
    monkeypatch.setattr(adm, "STANDING_CALM_SECONDS", 0.2)
    line, held = await standing_line()
    line.release(held)  # no work left waiting: drained
    held = await line.acquire()  # a connection free, nobody waiting

    def newcomer() -> asyncio.Task[int]:
        # Expects 100 ms: within the budget, past the tenth.
        line.hold_ms = 100.0
        return asyncio.create_task(take(line, Priority.WORK, [], "newcomer"))

    first = newcomer()
    await asyncio.sleep(0)
    assert line.standing
    with pytest.raises(DatabaseBusy):
        await first
    line.release(held)
    await asyncio.sleep(adm.STANDING_CALM_SECONDS)
    held = await line.acquire()  # drained and calm: it stands no more
    assert not line.standing
    later = newcomer()
    await asyncio.sleep(0)
    assert not later.done()  # let in: waits its turn within the budget
    line.release(held)
    line.release(await later)


async def test_slow_grants_now_and_then_do_not_keep_a_drained_line_standing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a flood, a wait past the tenth now and then, the line drained in between,
    is not a line that stands: it stands no more STANDING_CALM_SECONDS after it was
    last found standing (beside 2,000 parked polls, counting from the last slow wait
    kept it standing after the flood, and its clients were refused)."""
    monkeypatch.setattr(adm, "STANDING_CALM_SECONDS", 0.2)
    line, held = await standing_line()
    line.release(held)  # drained
    loop = asyncio.get_running_loop()
    until = loop.time() + 0.4
    while loop.time() < until:
        held = await line.acquire()  # a connection free, nobody waiting
        line.hold_ms = 1.0  # let in, whatever the holds were
        slow = asyncio.create_task(take(line, Priority.WORK, [], "slow"))
        await asyncio.sleep(0.06)  # waits past the tenth
        line.release(held)
        line.release(await slow)  # granted, and the line drained with it
    assert not line.standing


async def test_aged_work_takes_every_other_slot_while_releases_wait() -> None:
    """Work past the tenth goes before releases, but one at a time: a release waiting
    beside a line of aged work gets every other slot, not the one after all of it."""
    line = admission(slots=1, budget_ms=500.0)
    held = await line.acquire()
    order: list[str] = []
    work = [asyncio.create_task(take(line, Priority.WORK, order, f"w{i}")) for i in range(3)]
    await asyncio.sleep(0.06)  # every one past 50 ms
    releases = [asyncio.create_task(take(line, Priority.RELEASE, order, f"r{i}")) for i in range(2)]
    await asyncio.sleep(0)
    line.release(held)
    pending: set[asyncio.Task[int]] = {*work, *releases}
    while pending:  # each holder gives its slot back as soon as it has it
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            line.release(task.result())
    assert order == ["w0", "r0", "w1", "r1", "w2"]
