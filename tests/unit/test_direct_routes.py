"""The claim path's routes (io.DirectRoute) are matched before Starlette's router by
`take`, a lean copy of Route.matches: on every request it must decide as the router
would, and give the handler the same scope."""

from __future__ import annotations

import pytest
from starlette.convertors import IntegerConvertor
from starlette.routing import Match, Route

from gateway.http.io import DirectRoute
from gateway.http.routes import ROUTES


async def _app(scope, receive, send):  # pragma: no cover - never called
    pass


DIRECT = [r for r in ROUTES if isinstance(r, DirectRoute)]
PATHS = [
    "/v1/runtimes/rt-1/claim",
    "/v1/runtimes/a%20b/claim",
    "/v1/runtimes//claim",
    "/v1/runtimes/rt-1/claim/",
    "/v1/runtimes/rt-1/x/claim",
    "/v1/tasks:complete",
    "/v1/tasks/0192e4a0-0000-7000-8000-000000000000/complete",
    "/v1/tasks/x/y/complete",
    "/v1/tasks",
    "/prefix/v1/runtimes/rt-1/claim",
    "/prefix",
    "/prefixv1/runtimes/rt-1/claim",
    "/",
    "",
]


def test_the_claim_and_the_completes_are_matched_directly() -> None:
    assert {r.name for r in DIRECT} == {"claim", "complete", "complete_many"}


@pytest.mark.parametrize("root_path", ["", "/prefix"])
@pytest.mark.parametrize("method", ["POST", "GET", "PUT"])
@pytest.mark.parametrize("path", PATHS)
def test_take_decides_as_the_router_and_gives_the_same_scope(
    path: str, method: str, root_path: str
) -> None:
    for route in DIRECT:
        scope = {"type": "http", "method": method, "path": path, "root_path": root_path}
        match, child = route.matches(dict(scope))
        taken = dict(scope)
        assert route.take(taken) is (match is Match.FULL)
        if match is Match.FULL:
            assert taken == {**scope, **child, "route": route}
        else:
            assert taken == scope  # untouched


def test_outer_path_parameters_are_kept() -> None:
    route = DIRECT[0]
    scope = {"type": "http", "method": "POST", "path": "/v1/runtimes/rt-1/claim"}
    scope["path"] = next(p for p in PATHS if route.matches({**scope, "path": p})[0] is Match.FULL)
    expected = route.matches({**scope, "path_params": {"outer": "1"}})[1]
    taken = {**scope, "path_params": {"outer": "1"}}
    assert route.take(taken)
    assert taken["path_params"] == expected["path_params"]


def test_a_converted_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="plain strings"):
        DirectRoute("/v1/things/{n:int}", _app, "POST", "thing")
    assert isinstance(Route("/v1/things/{n:int}", _app).param_convertors["n"], IntegerConvertor)
