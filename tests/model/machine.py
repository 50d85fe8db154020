"""The state machine: random API calls, clock moves and Redis faults against one real
gateway, each checked against the model (model.py) as it is answered.

Hypothesis drives sync rules; the gateway, its HTTP session and the test's own
Postgres and Redis connections live on one event loop that the test holds, and each
rule runs its coroutine to completion there. Each example has runtimes of its own and
deletes its tasks at teardown, so every example starts from an empty table (the
janitor's counts are database-wide).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from datetime import datetime
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.support.http import Resp, req
from tests.support.waiting import wait_until

from . import interventions as act
from .interventions import Env
from .model import Model, Task, fingerprint

# Far enough that no example's wall time reaches them: only the test moves time.
DELAY = 3600
TTL = 7200
LEASE = 600

RUNTIME = st.integers(0, 1)
WORKERS = st.sampled_from(["w1", "w2"])
KEYS = st.none() | st.sampled_from(["k1", "k2", "k3"])
BODIES = st.fixed_dictionaries(
    {"payload": st.integers(0, 2)},
    optional={
        "priority": st.sampled_from([0, 50, 100]),
        "delay_seconds": st.sampled_from([0, DELAY]),
        "ttl_seconds": st.just(TTL),
        "max_attempts": st.integers(1, 3),
    },
)


DUE_BODIES = st.fixed_dictionaries(
    {"payload": st.integers(0, 2)},
    optional={"priority": st.sampled_from([0, 50, 100]), "max_attempts": st.integers(1, 3)},
)


def seconds_between(later: str, earlier: str) -> float:
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


class GatewayMachine(RuleBasedStateMachine):
    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        tag = secrets.token_hex(4)
        self.runtimes = [f"model-{tag}-a", f"model-{tag}-b"]
        self.model = Model(self.runtimes)
        self.bodies: dict[str, dict[str, Any]] = {}  # task id -> the body that made it

    # -- plumbing ------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> Resp:
        if body is None:
            return self.env.run(req(self.env.inst, method, path, headers=headers))
        return self.env.run(req(self.env.inst, method, path, body, headers=headers))

    def check_task(self, shown: dict[str, Any], task: Task) -> None:
        """The API's task object agrees with the model's task."""
        want = {
            "id": task.id,
            "runtime_id": task.runtime,
            "status": task.shown,
            "attempts": task.attempts,
            "priority": task.priority,
            "max_attempts": task.max_attempts,
        }
        got = {k: shown.get(k) for k in want}
        assert got == want, (got, want)
        assert shown.get("last_error") == task.last_error, (shown, task)
        assert shown.get("result") == (task.result if task.shown == "completed" else None)
        if task.shown == "claimed":
            held = {k: shown[k] for k in ("lease_id", "worker_id", "cancel_requested")}
            assert held == {
                "lease_id": task.lease,
                "worker_id": task.worker,
                "cancel_requested": task.cancel_requested,
            }, (shown, task)
        else:
            assert "lease_id" not in shown, shown

    def check_granted(self, shown: dict[str, Any], lease_seconds: int) -> None:
        """A claim or heartbeat's lease runs lease_seconds from that statement."""
        granted = seconds_between(shown["lease_expires_at"], shown["updated_at"])
        assert abs(granted - lease_seconds) < 0.05, (granted, lease_seconds, shown)

    def check_lease_answer(self, resp: Resp, task_id: str, held: bool) -> None:
        if not held:
            assert resp.status == 409, (resp.status, resp.body)
            assert resp.body["code"] == "lease_lost", resp.body
        else:
            assert resp.status == 200, (resp.status, resp.body)
            self.check_task(resp.body, self.model.tasks[task_id])

    def pick_lease(self, data: st.DataObject) -> tuple[str, str]:
        """Most often a lease that holds its task now; else one its task has moved on
        from (reported, or lapsed and reclaimed), or one nobody was given (I7). Lists
        are in creation order, never by the server's random ids, so a run replays."""
        claimed = self.model.where(lambda t: t.status == "claimed")
        held = [(t.id, t.lease) for t in claimed]
        moved_on = [(i, lease) for i, lease in self.model.leases if (i, lease) not in held]
        targets = [t.id for t in claimed] or list(self.model.tasks)
        choices = [st.sampled_from(held)] * 2 if held else []
        choices += [st.sampled_from(moved_on)] if moved_on else []
        choices += [st.tuples(st.sampled_from(targets), st.uuids().map(str))]
        task_id, lease = data.draw(st.one_of(*choices), label="lease")
        assert lease is not None
        return task_id, lease

    def pick_task(self, data: st.DataObject, predicate: Any = None) -> Task:
        found = self.model.where(predicate or (lambda t: True))
        return data.draw(st.sampled_from(sorted(found, key=lambda t: t.seq)), label="task")

    # -- producers -----------------------------------------------------------

    @initialize(
        rt=RUNTIME, bodies=st.lists(BODIES, min_size=1, max_size=5), claims=st.integers(0, 3)
    )
    def some_work(self, rt: int, bodies: list[dict[str, Any]], claims: int) -> None:
        """Every example starts with tasks, some of them held, so that even a short one
        reaches the lease rules."""
        self.enqueue_batch(rt, [(body, None) for body in bodies])
        if claims:
            self.claim(rt, claims, 0)

    def _enqueue(self, rt: int, body: dict[str, Any], key: str | None, in_header: bool) -> None:
        runtime = self.runtimes[rt]
        sent, headers = dict(body), {}
        if key is not None and in_header:
            headers["Idempotency-Key"] = key
        elif key is not None:
            sent["idempotency_key"] = key
        resp = self.call("POST", f"/v1/runtimes/{runtime}/tasks", sent, **headers)
        known = self.model.known_key(runtime, key)
        if known is None:
            assert resp.status == 201, (resp.status, resp.body)
            task = self.model.add(runtime, resp.body["id"], body, key)
            self.bodies[task.id] = body
        elif known.fingerprint == fingerprint(body):
            assert resp.status == 200, (resp.status, resp.body)
            assert resp.headers.get("Idempotent-Replayed") == "true", resp.headers
            task = known
        else:
            assert resp.status == 422, (resp.status, resp.body)
            assert resp.body["code"] == "idempotency_key_reused", resp.body
            return
        self.check_task(resp.body, task)

    @rule(rt=RUNTIME, body=BODIES, key=KEYS, in_header=st.booleans())
    def enqueue(self, rt: int, body: dict[str, Any], key: str | None, in_header: bool) -> None:
        self._enqueue(rt, body, key, in_header)

    @precondition(lambda self: self.model.keys)
    @rule(data=st.data(), same=st.booleans(), in_header=st.booleans())
    def replay(self, data: st.DataObject, same: bool, in_header: bool) -> None:
        """A key sent again: with the same request (a replay) or another (refused)."""
        (runtime, key), task_id = data.draw(st.sampled_from(sorted(self.model.keys.items())))
        body = dict(self.bodies[task_id])
        if not same:
            body["payload"] = body["payload"] + 10
        elif body.get("priority", 50) == 50 and data.draw(st.booleans(), label="respell"):
            # A default spelled out or left out is the same request.
            if body.pop("priority", None) is None:
                body["priority"] = 50
        self._enqueue(self.runtimes.index(runtime), body, key, in_header)

    @rule(
        rt=RUNTIME,
        items=st.lists(st.tuples(BODIES, KEYS), min_size=1, max_size=3).filter(
            lambda items: len([k for _, k in items if k]) == len({k for _, k in items if k})
        ),
    )
    def enqueue_batch(self, rt: int, items: list[tuple[dict[str, Any], str | None]]) -> None:
        runtime = self.runtimes[rt]
        sent = [dict(body, **({"idempotency_key": key} if key else {})) for body, key in items]
        resp = self.call("POST", f"/v1/runtimes/{runtime}/tasks:batch", {"tasks": sent})
        known = [self.model.known_key(runtime, key) for _, key in items]
        if any(
            t and t.fingerprint != fingerprint(b) for t, (b, _) in zip(known, items, strict=True)
        ):
            assert resp.status == 422, (resp.status, resp.body)
            assert resp.body["code"] == "idempotency_key_reused", resp.body
            return  # all or nothing: the new items are not stored either
        if all(known):
            assert resp.status == 200, (resp.status, resp.body)
            assert resp.headers.get("Idempotent-Replayed") == "true", resp.headers
        else:
            assert resp.status == 201, (resp.status, resp.body)
        shown = resp.body["tasks"]
        assert len(shown) == len(items), shown
        for got, task, (body, key) in zip(shown, known, items, strict=True):
            if task is None:
                task = self.model.add(runtime, got["id"], body, key)
                self.bodies[task.id] = body
            self.check_task(got, task)

    # -- daemons -------------------------------------------------------------

    @rule(rt=RUNTIME, max_tasks=st.integers(1, 3), wait=st.sampled_from([0, 0.05]), worker=WORKERS)
    def claim(self, rt: int, max_tasks: int, wait: float, worker: str = "w1") -> None:
        runtime = self.runtimes[rt]
        expected = self.model.expected_claim(runtime, max_tasks)
        body = {"worker_id": worker, "max_tasks": max_tasks, "wait_seconds": wait}
        resp = self.call("POST", f"/v1/runtimes/{runtime}/claim", dict(body, lease_seconds=LEASE))
        got = self._claimed(resp, worker)
        if not (got == [] and self.model.stale[runtime]):
            # Only a verdict that a lost bump left behind may hide due tasks, and then
            # it hides them all; otherwise exactly the first due tasks by priority,
            # then age: never one with a lease, one not yet due, or one expired.
            assert got == expected, (got, expected, self.model.claimable(runtime))
        if got:
            self.model.stale[runtime] = False  # this claim went to Postgres

    def _claimed(self, resp: Resp, worker: str) -> list[str]:
        """The ids a claim answered, each now held under the lease it came with."""
        assert resp.status == 200, (resp.status, resp.body)
        for shown in resp.body["tasks"]:
            self.model.claimed(shown["id"], shown["lease_id"], worker)
            self.check_task(shown, self.model.tasks[shown["id"]])
            self.check_granted(shown, LEASE)
        return [t["id"] for t in resp.body["tasks"]]

    def _idle(self) -> list[str]:
        return [rt for rt in self.runtimes if not self.model.claimable(rt)]

    @precondition(lambda self: self._idle())
    @rule(data=st.data(), body=DUE_BODIES)
    def wake_a_parked_claim(self, data: st.DataObject, body: dict[str, Any]) -> None:
        """A claim parked on a runtime with nothing due gets the task enqueued meanwhile,
        through the bump and its wake-up (I1, I8), whatever the verdict said."""
        runtime = data.draw(st.sampled_from(self._idle()), label="runtime")
        claim, enqueue = self.env.run(self._enqueue_under_a_parked_claim(runtime, body))
        assert enqueue.status == 201, (enqueue.status, enqueue.body)
        task = self.model.add(runtime, enqueue.body["id"], body, None)
        assert self._claimed(claim, "parked") == [task.id]

    async def _enqueue_under_a_parked_claim(
        self, runtime: str, body: dict[str, Any]
    ) -> tuple[Resp, Resp]:
        inst = self.env.inst
        poll = {"worker_id": "parked", "wait_seconds": 5, "lease_seconds": LEASE}
        claim = asyncio.ensure_future(req(inst, "POST", f"/v1/runtimes/{runtime}/claim", poll))
        try:
            await wait_until(lambda: inst.gateway.claimer.parked(runtime) > 0, 5, "a parked claim")
            enqueue = await req(inst, "POST", f"/v1/runtimes/{runtime}/tasks", body)
            return await claim, enqueue
        finally:
            claim.cancel()  # a no-op once answered; a failed step leaves no request behind

    @precondition(lambda self: self.model.leases)
    @rule(data=st.data(), lease_seconds=st.sampled_from([LEASE, 2 * LEASE]))
    def heartbeat(self, data: st.DataObject, lease_seconds: int) -> None:
        task_id, lease = self.pick_lease(data)
        body = {"lease_id": lease, "lease_seconds": lease_seconds}
        resp = self.call("POST", f"/v1/tasks/{task_id}/heartbeat", body)
        held = self.model.heartbeat(task_id, lease)
        self.check_lease_answer(resp, task_id, held)
        if held:
            self.check_granted(resp.body, lease_seconds)

    @precondition(lambda self: self.model.leases)
    @rule(data=st.data(), result=st.integers(0, 2))
    def complete(self, data: st.DataObject, result: int) -> None:
        task_id, lease = self.pick_lease(data)
        body = {"lease_id": lease, "result": result}
        resp = self.call("POST", f"/v1/tasks/{task_id}/complete", body)
        self.check_lease_answer(resp, task_id, self.model.complete(task_id, lease, result))

    @precondition(lambda self: self.model.leases)
    @rule(data=st.data(), retry=st.booleans(), after=st.sampled_from([0, DELAY, None]))
    def fail(self, data: st.DataObject, retry: bool, after: float | None) -> None:
        task_id, lease = self.pick_lease(data)
        error = f"boom {len(self.model.leases)}"
        body: dict[str, Any] = {"lease_id": lease, "error": error, "retry": retry}
        if after is not None:
            body["retry_after_seconds"] = after
        attempts = self.model.tasks[task_id].attempts
        held = self.model.fail(task_id, lease, error, retry, after)
        resp = self.call("POST", f"/v1/tasks/{task_id}/fail", body)
        self.check_lease_answer(resp, task_id, held)
        requeued = held and self.model.tasks[task_id].status == "queued"
        if requeued and after is None:
            # Exponential backoff with jitter: 2^attempts s, times 0.5 to 1.
            backoff = seconds_between(resp.body["run_at"], resp.body["updated_at"])
            assert 0.5 * 2**attempts - 0.01 <= backoff <= 2**attempts + 0.01, resp.body
            # Its due time is seconds away: put it out of reach, as the model says.
            self.env.run(act.postpone(self.env, task_id, DELAY))

    @precondition(lambda self: self.model.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        task_id, lease = self.pick_lease(data)
        resp = self.call("POST", f"/v1/tasks/{task_id}/release", {"lease_id": lease})
        self.check_lease_answer(resp, task_id, self.model.release(task_id, lease))

    # -- operators -----------------------------------------------------------

    @precondition(lambda self: self.model.tasks)
    @rule(data=st.data(), op=st.sampled_from(["cancel", "retry"]))
    def operator(self, data: st.DataObject, op: str) -> None:
        task = self.pick_task(data)
        resp = self.call("POST", f"/v1/tasks/{task.id}/{op}")
        expected = self.model.cancel(task.id) if op == "cancel" else self.model.retry(task.id)
        self._check_operator_answer(resp, task, expected)

    def _check_operator_answer(self, resp: Resp, task: Task, status: int) -> None:
        assert resp.status == status, (resp.status, resp.body, task)
        if status == 200:
            self.check_task(resp.body, task)
        else:
            assert resp.body["code"] == "invalid_state", resp.body

    # -- time and the janitor ------------------------------------------------

    @rule(data=st.data())
    def time_passes(self, data: st.DataObject) -> None:
        """Beyond a due time, a lease, a TTL (on one task), or every verdict's life."""
        moves = [name for name, (applies, _) in act.TASK_MOVES.items() if self.model.where(applies)]
        move = data.draw(st.sampled_from([*moves, "verdicts lapse"]), label="move")
        if move == "verdicts lapse":
            self.env.run(act.verdicts_lapse(self.env, self.model))
            return
        applies, apply = act.TASK_MOVES[move]
        self.env.run(apply(self.env, self.model, self.pick_task(data, applies)))

    @rule()
    def janitor(self) -> None:
        """A janitor pass, a few seconds after the last: every task due now has been due
        for more than the second the repair waits for."""
        self.env.run(act.janitor_interval(self.env, self.model))
        stale = {rt for rt, is_stale in self.model.stale.items() if is_stale}
        hidden = {rt for rt in stale if any(t.surely_due_for_repair() for t in self.model.of(rt))}
        report = self.env.run(self.env.inst.gateway.janitor.run_once())
        reclaimed, bumped = self.model.janitor_reclaim()
        assert report.errors == [], report
        assert report.reclaimed == reclaimed, (report, reclaimed)
        repaired = set(report.repaired)
        # Every verdict hiding due tasks is repaired, and only those (I6); the
        # reclaim's own bumps came first.
        assert repaired == hidden - bumped, (repaired, hidden, bumped)
        for runtime in repaired:
            self.model.stale[runtime] = False

    # -- Redis faults ---------------------------------------------------------

    @rule(rt=RUNTIME)
    def lose_bump(self, rt: int) -> None:
        self.env.run(act.lost_bump(self.env, self.model, self.runtimes[rt]))

    @rule(rt=RUNTIME, everything=st.booleans())
    def lose_keys(self, rt: int, everything: bool) -> None:
        """The runtime's version key, or every key of this gateway (a flush)."""
        lose = act.flush if everything else act.lost_version
        self.env.run(lose(self.env, self.model, self.runtimes[rt]))

    # -- what must hold after every step --------------------------------------

    @invariant()
    def visible_state_is_as_modelled(self) -> None:
        """Each runtime's listing (every task, oldest first) and stats counts."""
        listings, stats = self.env.run(self._read_state())
        for runtime, listing, counts in zip(self.runtimes, listings, stats, strict=True):
            assert listing.status == 200 and counts.status == 200, (listing, counts)
            shown = listing.body["tasks"]
            mine = sorted(self.model.of(runtime), key=lambda t: t.seq)
            assert [t["id"] for t in shown] == [t.id for t in mine]
            for got, task in zip(shown, mine, strict=True):
                self.check_task(got, task)
            nonzero = {s: n for s, n in counts.body["counts"].items() if n}
            assert nonzero == dict(Counter(t.shown for t in mine))

    async def _read_state(self) -> tuple[list[Resp], list[Resp]]:
        inst = self.env.inst
        base = [f"/v1/runtimes/{runtime}" for runtime in self.runtimes]
        listings = [req(inst, "GET", f"{path}/tasks?limit=1000") for path in base]
        stats = [req(inst, "GET", f"{path}/stats") for path in base]
        answers = await asyncio.gather(*listings, *stats)
        return answers[: len(base)], answers[len(base) :]

    def teardown(self) -> None:
        self.env.run(act.forget(self.env, self.model))
