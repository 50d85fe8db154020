"""The blocking `Client` and the async `AsyncClient` have the same methods, each with the
same parameters (names, kinds, types, defaults) and the same answer (an async iterator
answers an iterator), overloads included, so that the two can never drift apart."""

from __future__ import annotations

import inspect
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from gateway_client import AsyncClient, Client

# Each's own way of being used with `with`.
CONTEXT = {"__aenter__", "__aexit__", "__enter__", "__exit__"}


def public_methods(cls: type) -> set[str]:
    """Its own and its bases' (AsyncClient's schedule calls are ScheduleCalls')."""
    return {
        name
        for klass in cls.__mro__[:-1]
        for name, value in vars(klass).items()
        if callable(value) and (not name.startswith("_") or name == "__init__")
    } - CONTEXT


def shape(function: Callable[..., Any]) -> tuple[list[tuple[str, Any, Any, Any]], Any]:
    """(each parameter's name, kind, default and type; the answer's type), with an async
    iterator's answer written as an iterator of the same items."""
    sig = inspect.signature(function, eval_str=True)
    params = [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]
    answer = sig.return_annotation
    if typing.get_origin(answer) is AsyncIterator:
        answer = Iterator[typing.get_args(answer)[0]]
    return params, answer


def test_both_have_the_same_methods() -> None:
    assert public_methods(Client) == public_methods(AsyncClient)


def test_each_method_has_the_same_parameters_and_answer() -> None:
    names = sorted(public_methods(AsyncClient))
    assert {"enqueue", "claim", "fail", "wait", "list_tasks", "iter_tasks"} <= set(names)
    for name in names:
        blocking, non_blocking = getattr(Client, name), getattr(AsyncClient, name)
        assert (
            inspect.iscoroutinefunction(non_blocking)
            or name == "__init__"
            or (inspect.isasyncgenfunction(non_blocking))
        ), name
        assert shape(blocking) == shape(non_blocking), name


def test_overloads_match_too() -> None:
    for name in sorted(public_methods(AsyncClient)):
        blocking = typing.get_overloads(getattr(Client, name))
        non_blocking = typing.get_overloads(getattr(AsyncClient, name))
        assert len(blocking) == len(non_blocking), name
        for one, other in zip(blocking, non_blocking, strict=True):
            assert shape(one) == shape(other), name
    assert typing.get_overloads(Client.enqueue), "enqueue's overloads are not seen"
