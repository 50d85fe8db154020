"""W3C Trace Context as a receiver checks it (api/trace.py): a malformed traceparent is
dropped with its tracestate, a malformed tracestate alone, and nothing is ever refused."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.datastructures import Headers

from gateway.api import trace
from gateway.api.trace import TraceContext

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "value",
    [
        PARENT,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",  # not sampled
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future",  # later version
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09",
    ],
)
def test_a_wellformed_traceparent_is_kept_as_sent(value: str) -> None:
    assert trace.parse(value) == TraceContext(value, None)


@pytest.mark.parametrize(
    "value",
    [
        None,
        42,
        "",
        "garbage",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace-id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent-id
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  # 00 takes no more
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace-id
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
    ],
)
def test_a_malformed_traceparent_is_dropped_with_its_tracestate(value: Any) -> None:
    assert trace.parse(value, "vendor=1") is None


@pytest.mark.parametrize(
    ("state", "kept"),
    [
        ("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", True),
        ("a=1,,b=2", True),  # empty members are allowed
        ("", False),
        ("no equals sign", False),
        ("a=1\x01", False),  # not printable
        ("a=" + "x" * 600, False),  # longer than kept
        (",".join(f"k{n}=v" for n in range(33)), False),  # more members than allowed
        (7, False),
    ],
)
def test_a_malformed_tracestate_alone_is_dropped(state: Any, kept: bool) -> None:
    assert trace.parse(PARENT, state) == TraceContext(PARENT, state if kept else None)


def test_headers_a_repeated_traceparent_is_malformed_and_tracestates_are_joined() -> None:
    two = Headers(raw=[(b"traceparent", PARENT.encode()), (b"traceparent", PARENT.encode())])
    assert trace.from_headers(two) is None
    states = Headers(
        raw=[
            (b"traceparent", PARENT.encode()),
            (b"tracestate", b"a=1"),
            (b"tracestate", b"b=2"),
        ]
    )
    assert trace.from_headers(states) == TraceContext(PARENT, "a=1,b=2")
    assert trace.from_headers(Headers()) is None


@pytest.mark.parametrize("item", [None, "x", [], {"traceparent": 5}, {"tracestate": "a=1"}])
def test_an_items_trace_that_is_not_a_context_is_none(item: Any) -> None:
    assert trace.from_item(item) is None


def test_the_answer_form() -> None:
    assert trace.as_json(None, "a=1") is None
    assert trace.as_json(PARENT, None) == {"traceparent": PARENT}
    assert trace.as_json(PARENT, "a=1") == {"traceparent": PARENT, "tracestate": "a=1"}
