"""HTTP handlers for daemons: the claim (a long poll, gateway/claim/claimer.py), with
the completes and fails it may carry, and the operations on one task's lease:
heartbeat, complete, fail, release (those on many at once, and the parsing and applying
of a claim's acknowledgements, are in gateway/http/handlers/batch.py). They import no
driver; gateway/http/routes.py holds the endpoint table and turns their errors into
answers.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ... import tracing
from ...admission import releasing
from ...api import decode, render, requests
from ...auth.principals import Principal
from ...claim.waiters import Carried, Departure
from ...errors import GatewayError, Overloaded, RetryLater, StoreUnavailable
from ...in_flight import claim_refusal
from ...instance import Gateway
from ...rows import Leased
from ...settings import Settings
from ..io import (
    CALLER,
    CLIENT_LEFT,
    HOLD_READING,
    ConstantResponse,
    DisconnectWatch,
    constant_problem,
    empty_tasks_response,
    json_response,
    read_json,
)
from . import batch

log = logging.getLogger("gateway.http")

NO_ACKS = orjson.Fragment(b"[]")


async def claim(request: Request, gw: Gateway, principal: Principal | None = None) -> Response:
    """A claim, after the acknowledgements it may carry (`complete`, `fail`) are
    applied and committed: their outcomes are answered as `acks` whatever becomes of
    the claim. `principal`: the caller's, whose runtime patterns bound the
    acknowledgements (None: every runtime)."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    # The decoded body is not kept in this frame: a parked poll would hold it for its
    # whole wait (about 0.2 KiB of its 15).
    req, acks = _parse(await read_json(request, gw.settings), gw.settings)
    if not req.wait_seconds and (acks is None or acks.empty) and gw.busy():
        # Too many requests at work (gateway/in_flight.py): a claim that carries nothing
        # and would not park is refused before any work, and its connection read again
        # after its Retry-After, as the door does with enqueues. The door refuses most
        # such claims before they get here (shedding.py); these are the rest (a body
        # in several reads, sent before the instance was busy).
        refusal, answer = busy_refusal(gw.settings.max_active_requests)
        request.scope[HOLD_READING] = float(refusal.retry_after_seconds)
        gw.shed_busy()
        if acks is None:
            return answer
        # It sent empty lists: answered as a refused claim that carried acknowledgements.
        return _acked([], NO_ACKS, refusal.retry_after_seconds)
    runtimes = None if principal is None else principal.runtimes
    entries: orjson.Fragment | None = None
    carried = None
    if acks is not None:
        # Completes alone ride with the claim, applied by its own statement; with fails
        # they are all applied first, in a transaction of their own.
        carried = batch.carry(acks, runtimes)
        if carried is None:
            # Written out at once: a parked poll holds the outcomes as one string (about
            # 0.2 KiB an outcome), not a dict per outcome, nor the results it reported.
            with releasing():  # they take a connection as completes and fails do
                answered = await batch.acknowledge(gw, acks, runtimes)
            entries = orjson.Fragment(orjson.dumps(answered))
        del acks
    gone = Departure()
    watch = DisconnectWatch(request.receive, gone.set) if req.wait_seconds else None
    try:
        rows = await gw.claimer.claim(
            runtime_id, req, gone if watch else None, carried, request.scope.get(CALLER)
        )
    except GatewayError as exc:
        if carried is not None:
            entries = await _carried_entries(gw, carried, exc)
        if entries is None:
            raise
        # The acknowledgements are committed: their outcomes are the answer, and the
        # refusal says when to claim again, as its Retry-After would have.
        wait = exc.retry_after_seconds if isinstance(exc, RetryLater) else 1
        return _acked([], entries, wait)
    finally:
        if watch is not None:
            watch.stop()
    if rows and (gone.is_set() or await _disconnected(request)):
        # The client left while its tasks were being leased: nobody would receive them.
        await gw.claimer.give_back(runtime_id, [row.task for row in rows])
        return Response(status_code=CLIENT_LEFT)
    if carried is not None:
        entries = await _carried_entries(gw, carried)
        if gone.is_set():
            # It left before its completes went in: they are applied all the same (its
            # worker finished those tasks), though nobody reads their outcomes.
            return Response(status_code=CLIENT_LEFT)
    if rows and tracing.active is not None:
        tracing.active.received(runtime_id, [r.task for r in rows])
    if entries is not None:
        held = None if rows else gw.claimer.held_seconds(runtime_id)
        tasks = await _deliverable(gw, rows) if rows else []
        return _acked(tasks, entries, None if held is None else math.ceil(held) or 1)
    if not rows:
        return empty_tasks_response()
    return json_response({"tasks": await _deliverable(gw, rows)})


@functools.cache
def busy_refusal(limit: int) -> tuple[Overloaded, ConstantResponse]:
    """The refusal of a bare claim while more than `limit` requests are at work, and its
    answer (429), encoded once: under a flood it is most of what the gateway writes.
    The door (shedding.py) answers it too."""
    refusal = claim_refusal(limit)
    return refusal, constant_problem(refusal)


async def _disconnected(request: Request) -> bool:
    """Whether the request's client has left: its connection's Caller says so without a
    read (Starlette's is_disconnected costs a cancel scope and a receive, on every claim
    that leased a task); under another server than the gateway's own, that read."""
    who = request.scope.get(CALLER)
    return who.gone if who is not None else await request.is_disconnected()


async def _carried_entries(
    gw: Gateway, carried: Carried, refused: GatewayError | None = None
) -> orjson.Fragment:
    """The answer's `acks` for completes that rode with the claim. Applied by the
    claim's statement as a rule; when the claim was refused or ended before one ran for
    it (`refused`: draining, the database queue full), they are applied now, alone, as
    a claim that carries fails applies its own. A database failure (StoreUnavailable)
    of the claim's statement applied nothing, and is its answer."""
    if carried.answer is None:
        if isinstance(refused, StoreUnavailable):
            raise refused
        with releasing():  # completes take a connection as completes do
            outcomes = await gw.completions.complete_many(
                carried.task_ids, carried.lease_ids, carried.results, carried.runtimes
            )
        carried.settled(outcomes)
        await gw.completes_settled(outcomes)
    assert isinstance(carried.answer, orjson.Fragment)
    return carried.answer


def _parse(
    body: dict[str, Any], settings: Settings
) -> tuple[requests.ClaimRequest, batch.Acks | None]:
    """The claim's request and the acknowledgements it carries, if any."""
    req = requests.parse_claim(body, settings.max_wait_seconds, settings.default_lease_seconds)
    return req, batch.parse_acks(body, settings)


def _acked(tasks: list[Any], entries: orjson.Fragment, retry_after_seconds: int | None) -> Response:
    """The answer to a claim that carried acknowledgements: the tasks, one entry per
    acknowledgement (completes first, in request order), and, when the claim was
    refused or its runtime held back (paused, at a limit), the seconds after which to
    claim again."""
    answer: dict[str, Any] = {"tasks": tasks, "acks": entries}
    if retry_after_seconds is not None:
        answer["retry_after_seconds"] = retry_after_seconds
    return json_response(answer)


async def _deliverable(gw: Gateway, rows: list[Leased]) -> list[orjson.Fragment]:
    """The claimed tasks as JSON. A task that cannot be shown is not left leased to
    nobody: it is ended `dead` with the reason, and the others are still delivered."""
    out = []
    for row in rows:
        task = row.task
        try:
            out.append(render.render_task(task))
        except Exception as exc:
            reason = f"the gateway could not turn this task into a response: {exc}"
            log.error("task %s of runtime %s ended dead: %s", task.id, task.runtime_id, reason)
            gw.metrics.tasks_unrenderable.inc()
            assert task.lease_id is not None  # a claimed row carries its lease
            try:
                await gw.store.bury(task.id, task.lease_id, reason)
                await gw.results.finished([(task.id, "dead")])
            except GatewayError as bury_error:
                # Its lease lapses and the janitor takes it back; at max_attempts it dies.
                log.warning("could not end task %s: %s", task.id, bury_error.detail)
    return out


async def heartbeat(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    body = await read_json(request, gw.settings)
    lease_id = requests.parse_lease_id(body)
    seconds = requests.parse_lease_seconds(body, gw.settings.default_lease_seconds)
    row = await gw.store.heartbeat(task_id, lease_id, seconds)
    gw.lease_spans.in_lease("heartbeat", row)
    return json_response(render.render_task_or_stub(row))


async def complete(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    body = await read_json(request, gw.settings)
    lease_id = requests.parse_lease_id(body)
    settings = gw.settings
    result = requests.result_json(
        body,
        settings.max_payload_bytes,
        settings.max_json_depth,
        requests.written_budget(settings.max_body_bytes),
    )
    row = await gw.completions.complete(task_id, lease_id, result)
    await gw.tasks_ended([(row.id, row.status)], [row.runtime_id])
    return json_response(render.render_task_or_stub(row))


async def fail(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    req = requests.parse_fail(await read_json(request, gw.settings))
    row = await gw.store.fail(task_id, req.lease_id, req.error, req.retry, req.retry_after_seconds)
    gw.lease_spans.ended(row, req.lease_id, "fail")
    if row.status == "queued":
        await gw.claimer.announce(row.runtime_id)
    else:
        await gw.tasks_ended([(row.id, row.status)], [row.runtime_id])
    return json_response(render.render_task_or_stub(row))


async def release(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    lease_id = requests.parse_lease_id(await read_json(request, gw.settings))
    row = await gw.store.release(task_id, lease_id)
    gw.lease_spans.ended(row, lease_id, "release")
    if row.status == "queued":
        await gw.claimer.announce(row.runtime_id)
    else:  # a cancel was requested while it was held: now cancelled
        await gw.results.finished([(row.id, row.status)])
    return json_response(render.render_task_or_stub(row))
