"""The worker loop sends a finished task's report with the next claim when that claim
goes out at once (one slot; or every slot busy and one frees while the others run),
against an in-memory gateway: one request per task, each outcome from the claim's
`acks`, and the report sent on its own when the claim fails or the gateway answers no
`acks`."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway_client import Claimed, Outcome, Task, TaskFailed, TransportError
from tests.support.fake_gateway import Call, FakeGateway, run_until, worker


def carried(fake: FakeGateway) -> list[Call]:
    """The claims that carried reports."""
    return [c for c in fake.named("claim") if c.args["complete"] or c.args["fail"]]


async def test_with_one_slot_each_report_rides_the_next_claim():
    fake = FakeGateway()
    tasks = fake.add(1, 2, 3)

    async def handler(task: Task) -> Any:
        if task.payload == 2:
            raise TaskFailed("two is wrong", retry=False)
        return task.payload * 10

    w = worker(fake, handler)
    await run_until(w, lambda: sum(w.outcomes.values()) == 3)
    assert w.outcomes == {Outcome.COMPLETED: 2, Outcome.FAILED: 1}
    claims = carried(fake)
    assert [c.args["complete"] + c.args["fail"] for c in claims] == [[t.id] for t in tasks]
    assert [c.args["fail"] for c in claims] == [[], [tasks[1].id], []]
    # Every report rode a claim: none had a request of its own.
    assert len(fake.named("complete")) + len(fake.named("fail")) == 3
    assert all(c.args["wait_seconds"] == 0 for c in claims)  # answered at once
    assert [c.args["result"] for c in fake.named("complete")] == [10, 30]
    assert not fake.leases


async def test_a_slot_freed_while_the_others_run_reports_with_the_claim_for_it():
    fake = FakeGateway()
    first, *_ = fake.add("quick", "slow", "slow")
    (nxt,) = fake.add("next")
    gate = asyncio.Event()

    async def handler(task: Task) -> Any:
        if task.payload == "slow":
            await gate.wait()
        return task.payload

    w = worker(fake, handler, concurrency=3, max_tasks_per_poll=3)
    job = asyncio.create_task(w.run())
    await run_until_true(lambda: bool(carried(fake)))
    claim = carried(fake)[0]
    assert claim.args["complete"] == [first.id] and claim.args["max_tasks"] == 1
    # "next" came with that claim and finished too, while the two slow ones still run.
    await run_until_true(lambda: w.outcomes == {Outcome.COMPLETED: 2})
    assert w.running == 2 and not gate.is_set()
    assert [c.args["complete"] for c in carried(fake)] == [[first.id], [nxt.id]]
    gate.set()
    await run_until_true(lambda: sum(w.outcomes.values()) == 4)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert w.outcomes == {Outcome.COMPLETED: 4} and not fake.leases


async def test_a_failed_claim_sends_its_reports_on_their_own():
    fake = FakeGateway()
    (task,) = fake.add("x")

    async def handler(t: Task) -> Any:
        fake.claim_errors.append(TransportError("the connection was reset"))
        return "done"

    w = worker(fake, handler)
    await run_until(w, lambda: w.outcomes[Outcome.COMPLETED] == 1)
    assert [c.args["complete"] for c in carried(fake)] == [[task.id]]  # the failed claim
    assert [c.args["task_id"] for c in fake.named("complete")] == [task.id]  # on its own
    assert w.outcomes == {Outcome.COMPLETED: 1}


class OlderGateway(FakeGateway):
    """A gateway that does not read reports on a claim: it answers no `acks`."""

    async def claim(self, runtime: str, worker_id: str, **args: Any) -> Claimed:
        complete, fail = args.pop("complete", None), args.pop("fail", None)
        claimed = await super().claim(runtime, worker_id, **args)
        self.calls[-1].args.update(complete=[i.task_id for i in complete or []], fail=[])
        assert not fail
        return Claimed(claimed)


async def test_reports_a_gateway_ignored_are_sent_on_their_own():
    fake = OlderGateway()
    (task,) = fake.add("x")
    w = worker(fake, lambda t: asyncio.sleep(0, "done"))
    await run_until(w, lambda: w.outcomes[Outcome.COMPLETED] == 1)
    assert [c.args["complete"] for c in carried(fake)] == [[task.id]]
    assert [c.args["task_id"] for c in fake.named("complete")] == [task.id]


class PausedGateway(FakeGateway):
    """Answers claims carrying reports as a paused runtime does: no tasks, and when to
    claim again."""

    async def claim(self, runtime: str, worker_id: str, **args: Any) -> Claimed:
        claimed = await super().claim(runtime, worker_id, **args)
        if args.get("complete") is not None:
            return Claimed([], claimed.acks, retry_after_seconds=0.5)
        return claimed


async def test_retry_after_seconds_in_an_answer_is_honoured():
    fake = PausedGateway()
    fake.add("x")
    w = worker(fake, lambda t: asyncio.sleep(0, "done"))
    job = asyncio.create_task(w.run())
    await run_until_true(lambda: w.outcomes[Outcome.COMPLETED] == 1)
    await asyncio.sleep(0.3)
    assert fake.named("claim")[-1].args["complete"], "claimed again before retry_after_seconds"
    await run_until_true(lambda: not fake.named("claim")[-1].args["complete"])
    w.stop()
    await asyncio.wait_for(job, 5)


async def run_until_true(condition: Any, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


class LosingGateway(FakeGateway):
    """Applies the next claim, reports and all, then loses its answer."""

    lose = 1

    async def claim(self, runtime: str, worker_id: str, **args: Any) -> Claimed:
        claimed = await super().claim(runtime, worker_id, **args)
        if self.lose and (args.get("complete") or args.get("fail")):
            self.lose -= 1
            raise TransportError("the connection was cut after the gateway answered")
        return claimed


async def test_a_fail_whose_claims_answer_was_lost_is_not_counted_as_a_lost_lease():
    """Sent again on its own, the fail finds the lease gone (its first send, with the
    claim, applied it): it counts as failed, not as a lease lost."""
    fake = LosingGateway()
    (task,) = fake.add("x")

    async def handler(t: Task) -> Any:
        raise TaskFailed("wrong", retry=False)

    w = worker(fake, handler)
    await run_until(w, lambda: sum(w.outcomes.values()) == 1)
    assert [c.args["fail"] for c in carried(fake)] == [[task.id]]  # applied, answer lost
    assert [c.args["task_id"] for c in fake.named("fail")] == [task.id, task.id]
    assert w.outcomes == {Outcome.FAILED: 1}
