"""The producer spans of an enqueue (gateway/tracing/spans.py): one per task a request
enqueues, single, batch or signed webhook, and the trace context each task stores.

With tracing off, a task stores the producer's own context, as sent: a body's or a
batch item's `trace`, else the request's `traceparent` and `tracestate` headers. With
it on, a task stores its producer span's context, a child of the request's server span
(itself a child of the headers'), or of the item's own context when it carries one;
whoever claims the task then continues from the gateway's span.

A task's id is known only after its insert, and what it stores must name its span
before: so each span starts before the insert, and `sent` ends it with the id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ... import tracing
from ...api import requests
from ...api.requests import EnqueueRequest
from ...api.trace import TraceContext


class Sending:
    """The requests to store for one HTTP request's tasks, and their producer spans
    (none while tracing is off). Owned by the handler that made it; each span is
    ended once, by `sent` or `failed`."""

    __slots__ = ("requests", "runtime_id", "spans")

    def __init__(
        self, runtime_id: str, reqs: Sequence[EnqueueRequest], headers: TraceContext | None
    ) -> None:
        self.runtime_id = runtime_id
        active = tracing.active
        if active is None:
            self.spans: list[Any] = []
            # A batch's thousand items are taken as they are unless headers came.
            self.requests = reqs if headers is None else [requests.traced(r, headers) for r in reqs]
            return
        # The headers' context is the server span's parent already (access.RequestLog):
        # a task's producer span is the server span's child, unless it has its own.
        made, spans = [], []
        for req in reqs:
            own = (req.trace_parent, req.trace_state) if req.trace_parent is not None else None
            span, stored = active.producer(runtime_id, own)
            spans.append(span)
            if stored is not None:
                req = req._replace(trace_parent=stored[0], trace_state=stored[1])
            made.append(req)
        if len(reqs) > 1:
            active.batch_size(len(reqs))
        self.spans = spans
        self.requests = made

    def sent(self, task_ids: Iterable[object], created: bool = True) -> None:
        """End the spans: the tasks were stored with these ids, in request order
        (`created` false: an idempotent replay answered them)."""
        active = tracing.active
        if active is not None:
            for span, task_id in zip(self.spans, task_ids, strict=False):
                active.sent(span, task_id, created)
        self.spans = []

    def failed(self, exc: BaseException) -> None:
        """End the spans: the enqueue failed with `exc`."""
        active = tracing.active
        if active is not None and self.spans:
            active.failed(self.spans, exc)
        self.spans = []
