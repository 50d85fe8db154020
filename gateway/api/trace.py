"""A task's trace context (W3C Trace Context, https://www.w3.org/TR/trace-context/):
the `traceparent` and `tracestate` a producer sends with an enqueue, as request headers
or a batch item's `trace` object, checked as the specification says a receiver checks
them. What is malformed is ignored, never refused: a producer's broken tracing must
not cost it its task.

The context is stored with the task and answered with it, as sent: the gateway reads
nothing in it but its form.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

# version "-" trace-id "-" parent-id "-" trace-flags, lower-case hex. A version after
# 00 may append fields after a dash (the specification's forward compatibility); 00 may
# not. Version ff is invalid, and so are an all-zero trace-id or parent-id.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = "0" * 32
_ZERO_PARENT = "0" * 16
# tracestate: at most 32 list-members of printable ASCII (the specification's
# recommendation a propagator follows: longer ones may be dropped whole), at most 512
# characters kept.
MAX_TRACESTATE_CHARS = 512
MAX_TRACESTATE_MEMBERS = 32
_TRACESTATE_CHARS = re.compile(r"[\x20-\x7e]*")


# The context in the OpenAPI document's components, for requests and answers alike.
SCHEMA_NAME = "TraceContext"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A W3C Trace Context (https://www.w3.org/TR/trace-context/), as the "
    "traceparent and tracestate headers carry it. Sent with an enqueue, it is stored "
    "with the task and given back with it; a malformed one is ignored, never refused.",
    "required": ["traceparent"],
    "properties": {
        "traceparent": {
            "type": "string",
            "description": "version-traceid-parentid-flags, lower-case hex.",
            "examples": ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
        },
        "tracestate": {
            "type": "string",
            "description": f"Vendor entries; at most {MAX_TRACESTATE_CHARS} characters kept.",
        },
    },
}


# A request's `trace` field: a TraceContext is used, and any other value is accepted and
# ignored (a producer's broken tracing never costs it its task), which the document says.
REQUEST_SCHEMA: dict[str, Any] = {"anyOf": [{"$ref": f"#/components/schemas/{SCHEMA_NAME}"}, {}]}


class TraceContext(NamedTuple):
    traceparent: str
    tracestate: str | None


def parse(traceparent: Any, tracestate: Any = None) -> TraceContext | None:
    """The context, or None when `traceparent` is absent or malformed (then
    `tracestate` goes too, as the specification says). A malformed `tracestate` alone
    is dropped and the `traceparent` kept."""
    if type(traceparent) is not str:
        return None
    value = traceparent.strip(" \t")
    found = _TRACEPARENT.fullmatch(value)
    if found is None:
        return None
    version, trace_id, parent_id, _flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_PARENT:
        return None
    return TraceContext(value, _tracestate(tracestate))


def _tracestate(given: Any) -> str | None:
    if type(given) is not str:
        return None
    value: str = given.strip(" \t")
    if not value or len(value) > MAX_TRACESTATE_CHARS:
        return None
    if not _TRACESTATE_CHARS.fullmatch(value):
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    if len(members) > MAX_TRACESTATE_MEMBERS or not all("=" in m for m in members if m):
        return None
    return value


def from_headers(headers: Mapping[str, str]) -> TraceContext | None:
    """The context of a request's `traceparent` and `tracestate` headers. A header sent
    twice is malformed for traceparent; tracestate's repeats are joined by a comma, as
    HTTP joins them (Starlette's `get` gives the first only, so they are read whole)."""
    getlist = getattr(headers, "getlist", None)
    if getlist is None:
        return parse(headers.get("traceparent"), headers.get("tracestate"))
    parents = getlist("traceparent")
    if len(parents) != 1:
        return None
    states = getlist("tracestate")
    return parse(parents[0], ",".join(states) if states else None)


def from_item(value: Any) -> TraceContext | None:
    """A batch item's (or an enqueue body's) `trace` object, or None."""
    if not isinstance(value, dict):
        return None
    return parse(value.get("traceparent"), value.get("tracestate"))


def as_json(traceparent: str | None, tracestate: str | None) -> dict[str, str] | None:
    """The `trace` object an answer carries, or None for a task without one."""
    if traceparent is None:
        return None
    if tracestate is None:
        return {"traceparent": traceparent}
    return {"traceparent": traceparent, "tracestate": tracestate}
