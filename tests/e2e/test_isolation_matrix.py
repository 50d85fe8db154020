"""The isolation matrix: every endpoint of routes.ENDPOINTS against callers who must be
refused, with a snapshot of the tasks and credentials tables (every column) before and
after showing that nothing changed.

For each endpoint: no token is 401; a token lacking the endpoint's scope is 403; a
token whose runtime patterns exclude the runtime is 403 on a runtime path and 404 on a
task path, where the foreign task is sent with its real lease_id, so that only the
runtime check stands between the caller and the task. The signed webhook endpoint is
refused unsigned and when signed for another runtime. The cases are built from
ENDPOINTS: an endpoint without a recipe below fails here until it gets one.

A positive control per endpoint shows that the same request passes with the needed
scope on its own runtime, so that no refusal above is a broken request's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
import pytest_asyncio

from gateway.api.credential_bodies import Scope
from gateway.http.routes import ENDPOINTS, Endpoint, Target
from tests.support.credentials import deliver, make_secret, make_token, snapshot, unique
from tests.support.http import req
from tests.support.lifecycle import (
    assert_problem,
    claim_one,
    enqueue,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

# The world's runtimes are named from this; a refusal must change none of their tasks.
WORLD_PREFIX = "iso"


@dataclass
class World:
    """What the requests aim at: runtime `rt` with a claimed and a cancelled task,
    a live token and webhook secret to revoke, and the callers."""

    rt: str
    claimed: dict[str, Any]
    cancelled: dict[str, Any]
    token_id: str
    secret_id: str
    lacking: dict[Scope, str]  # every scope but the key, every runtime
    elsewhere: str  # every scope but admin, for another runtime only
    elsewhere_secret: str  # a webhook secret for another runtime only
    own_secret: str  # a webhook secret covering rt


@dataclass(frozen=True)
class Recipe:
    """A request that the endpoint would carry out for an entitled caller."""

    body: Callable[[World], Any] | None = None
    task: str = "claimed"  # which of the world's tasks {task_id} names
    expect: int = 200  # the positive control's status


# The world's schedule ticks once a year (at midnight on 1 January): never on its own
# during the test.
SCHEDULE = "/v1/runtimes/{rt}/schedules/{name}"
WORLD_SCHEDULE = {"cron": "0 0 1 1 *", "payload": {"x": 1}}


def last_hour() -> dict[str, str]:
    now = datetime.now(UTC)
    return {"start": (now - timedelta(hours=1)).isoformat(), "end": now.isoformat()}


def lease(w: World) -> dict[str, Any]:
    return {"lease_id": w.claimed["lease_id"]}


def item(w: World) -> dict[str, Any]:
    """A batch item naming the world's claimed task, with its real lease."""
    return {"id": w.claimed["id"], **lease(w)}


RECIPES: dict[tuple[str, str], Recipe] = {
    ("POST", "/v1/runtimes/{rt}/tasks"): Recipe(lambda w: {"payload": {"x": 1}}, expect=201),
    ("GET", "/v1/runtimes/{rt}/tasks"): Recipe(),
    ("POST", "/v1/runtimes/{rt}/tasks:batch"): Recipe(
        lambda w: {"tasks": [{"payload": 1}, {"payload": 2}]}, expect=201
    ),
    ("GET", "/v1/runtimes/{rt}/stats"): Recipe(),
    ("POST", "/v1/runtimes/{rt}/claim"): Recipe(lambda w: {"worker_id": "intruder"}),
    ("GET", "/v1/tasks/{task_id}"): Recipe(),
    ("POST", "/v1/tasks/{task_id}/heartbeat"): Recipe(lease),
    ("POST", "/v1/tasks/{task_id}/complete"): Recipe(lambda w: {**lease(w), "result": "stolen"}),
    ("POST", "/v1/tasks/{task_id}/fail"): Recipe(lambda w: {**lease(w), "error": "sabotage"}),
    ("POST", "/v1/tasks/{task_id}/release"): Recipe(lease),
    ("POST", "/v1/tasks/{task_id}/cancel"): Recipe(),
    ("POST", "/v1/tasks/{task_id}/retry"): Recipe(task="cancelled"),
    # A runtime's tasks in bulk: `enqueue`, as for one task; its error groups: `read`. The
    # retry takes expired tasks, which the world has none of, so that the single retry's
    # positive control still finds its cancelled task.
    ("POST", "/v1/runtimes/{rt}/tasks:retry"): Recipe(lambda w: {"status": "expired"}),
    ("POST", "/v1/runtimes/{rt}/tasks:cancel"): Recipe(lambda w: {"status": "queued"}),
    ("GET", "/v1/runtimes/{rt}/errors"): Recipe(),
    ("POST", "/v1/runtimes/{rt}/webhooks"): Recipe(lambda w: {"event": "x"}, expect=201),
    # Batch lease operations: the world's claimed task, named in the body.
    ("POST", "/v1/tasks:complete"): Recipe(lambda w: {"tasks": [{**item(w), "result": "stolen"}]}),
    ("POST", "/v1/tasks:fail"): Recipe(lambda w: {"tasks": [{**item(w), "error": "sabotage"}]}),
    ("POST", "/v1/tasks:heartbeat"): Recipe(lambda w: {"tasks": [item(w)]}),
    ("POST", "/v1/admin/tokens"): Recipe(
        lambda w: {"name": unique("mint"), "scopes": ["admin"]}, expect=201
    ),
    ("GET", "/v1/admin/tokens"): Recipe(),
    ("DELETE", "/v1/admin/tokens/{token_id}"): Recipe(expect=204),
    ("POST", "/v1/admin/webhook-secrets"): Recipe(
        lambda w: {"name": unique("mint"), "runtimes": [unique("mint")]}, expect=201
    ),
    ("GET", "/v1/admin/webhook-secrets"): Recipe(),
    ("DELETE", "/v1/admin/webhook-secrets/{secret_id}"): Recipe(expect=204),
    # Lists, never refuses, by runtime: a token sees only the runtimes its patterns cover
    # (tests/e2e/test_console_api.py).
    ("GET", "/v1/runtimes"): Recipe(),
    # The history: a runtime's takes `read` on it; the fleet's, like the listing, answers
    # from the runtimes a token covers (tests/integration/test_history.py).
    ("GET", "/v1/runtimes/{rt}/history"): Recipe(),
    ("GET", "/v1/history"): Recipe(),
    # The answering instance's load: instance-wide, any `read` token sees it.
    ("GET", "/v1/instance/load"): Recipe(),
    # Runtime controls: reading takes `read`, changing them `control`.
    ("GET", "/v1/runtimes/{rt}/controls"): Recipe(),
    ("PATCH", "/v1/runtimes/{rt}/controls"): Recipe(lambda w: {"max_in_flight": 1}),
    ("POST", "/v1/runtimes/{rt}:pause"): Recipe(),
    ("POST", "/v1/runtimes/{rt}:resume"): Recipe(),
    # Schedules: managing them takes `enqueue`, reading them `read`; the world's schedule.
    ("GET", "/v1/runtimes/{rt}/schedules"): Recipe(),
    ("PUT", SCHEDULE): Recipe(lambda w: {"cron": "0 0 2 1 *", "payload": {"x": 2}}),
    ("GET", SCHEDULE): Recipe(),
    ("DELETE", SCHEDULE): Recipe(expect=204),
    ("POST", SCHEDULE + ":trigger"): Recipe(),
    ("POST", SCHEDULE + ":pause"): Recipe(),
    ("POST", SCHEDULE + ":resume"): Recipe(),
    ("POST", SCHEDULE + ":backfill"): Recipe(lambda w: last_hour()),
}
PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics"), ("GET", "/openapi.json")}
SIGNED = {("POST", "/v1/runtimes/{rt}/webhooks")}


def key(e: Endpoint) -> tuple[str, str]:
    return (e.method, e.path)


def recipe_for(e: Endpoint) -> Recipe:
    recipe = RECIPES.get(key(e))
    if recipe is None:
        pytest.fail(
            f"{e.method} {e.path} has no request recipe in the isolation matrix; add one to "
            "RECIPES (or to PUBLIC, if it truly needs no credentials)"
        )
    return recipe


async def make_world(gw, rt: str) -> World:
    await enqueue(gw, rt, {"secret": "work"})
    claimed = await claim_one(gw, rt, lease_seconds=600)
    victim = await enqueue(gw, rt, "to be cancelled")
    cancelled = await req(gw, "POST", f"/v1/tasks/{victim['id']}/cancel")
    assert cancelled.body["status"] == "cancelled"
    made = await req(gw, "PUT", f"/v1/runtimes/{rt}/schedules/daily", WORLD_SCHEDULE)
    assert made.status == 201, made.body
    other = unique(f"{WORLD_PREFIX}-other")
    everything = [s.value for s in Scope if s is not Scope.ADMIN]
    lacking = {
        scope: (await make_token(gw, [s for s in everything if s != scope.value]))["token"]
        for scope in Scope
    }
    return World(
        rt=rt,
        claimed=claimed,
        cancelled=cancelled.body,
        token_id=(await make_token(gw, ["read"]))["id"],
        secret_id=(await make_secret(gw, [unique("iso-unused")]))["id"],
        lacking=lacking,
        elsewhere=(await make_token(gw, everything, [other, f"{other}-*"]))["token"],
        elsewhere_secret=(await make_secret(gw, [other]))["secret"],
        own_secret=(await make_secret(gw, [rt]))["secret"],
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(gw) -> World:
    return await make_world(gw, unique(WORLD_PREFIX))


def path_of(e: Endpoint, w: World, recipe: Recipe) -> str:
    task = w.claimed if recipe.task == "claimed" else w.cancelled
    return e.path.format(
        rt=w.rt, task_id=task["id"], token_id=w.token_id, secret_id=w.secret_id, name="daily"
    )


async def send(gw, e: Endpoint, w: World, token: str | None):
    recipe = recipe_for(e)
    body = recipe.body(w) if recipe.body else None
    path = path_of(e, w, recipe)
    if body is None:
        return await req(gw, e.method, path, auth=token)
    return await req(gw, e.method, path, body, auth=token)


def endpoint_id(e: Endpoint) -> str:
    return f"{e.method} {e.path}"


async def test_every_recipe_names_a_current_endpoint():
    current = {key(e) for e in ENDPOINTS}
    assert set(RECIPES) - current == set()
    assert PUBLIC | SIGNED <= current


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=endpoint_id)
async def test_refusals_change_nothing(gw, world, endpoint):
    if key(endpoint) in PUBLIC:
        assert endpoint.scope is None
        resp = await req(gw, endpoint.method, endpoint.path, auth=None)
        assert resp.status in (200, 503), resp.body  # answers without credentials
        return
    recipe = recipe_for(endpoint)
    before = await snapshot(gw, WORLD_PREFIX)
    assert len(before["tasks"]) == 2, before["tasks"]  # the world's: claimed, cancelled

    if key(endpoint) in SIGNED:
        assert endpoint.scope is None and endpoint.target is Target.RUNTIME
        body = recipe.body(world) if recipe.body else {}
        # Unsigned; then signed by a secret for another runtime.
        assert_problem(await deliver(gw, world.rt, body), 401, "invalid_signature")
        resp = await deliver(gw, world.rt, body, secret=world.elsewhere_secret)
        assert_problem(resp, 401, "invalid_signature")
    else:
        assert endpoint.scope is not None, f"{endpoint_id(endpoint)}: not in PUBLIC or SIGNED"
        resp = await send(gw, endpoint, world, None)
        assert_problem(resp, 401, "unauthorized")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")

        resp = await send(gw, endpoint, world, world.lacking[endpoint.scope])
        assert_problem(resp, 403, "forbidden")

        if endpoint.target is not Target.NONE:
            resp = await send(gw, endpoint, world, world.elsewhere)
            if endpoint.target is Target.RUNTIME:
                assert_problem(resp, 403, "forbidden")
            elif endpoint.target is Target.TASKS:
                # Tasks named in the body: a foreign one is that item's not_found.
                assert resp.status == 200, (resp.status, resp.body)
                assert [r["outcome"] for r in resp.body["results"]] == ["not_found"], resp.body
            else:
                # A foreign task is indistinguishable from one that does not exist.
                assert_problem(resp, 404, "not_found")

    assert await snapshot(gw, WORLD_PREFIX) == before


@pytest.mark.parametrize(
    "endpoint", [e for e in ENDPOINTS if key(e) not in PUBLIC], ids=endpoint_id
)
async def test_the_needed_scope_on_its_own_runtime_is_enough(gw, endpoint):
    """The positive control, on a world of its own (it changes things). Public
    endpoints need nothing, which the matrix above already shows."""
    recipe = recipe_for(endpoint)
    w = await make_world(gw, unique("own"))
    if key(endpoint) in SIGNED:
        body = orjson.dumps(recipe.body(w) if recipe.body else {})
        resp = await deliver(gw, w.rt, body, secret=w.own_secret)
    else:
        assert endpoint.scope is not None
        # An admin token covers every runtime; the others get a glob covering rt only.
        runtimes = None if endpoint.scope is Scope.ADMIN else [w.rt[:-2] + "*"]
        token = (await make_token(gw, [endpoint.scope.value], runtimes))["token"]
        resp = await send(gw, endpoint, w, token)
    assert resp.status == recipe.expect, (resp.status, resp.body)
    if endpoint.target is Target.TASKS:  # a batch answers 200 whatever its items' outcomes
        assert "problem" not in resp.body["results"][0], resp.body


async def test_the_world_is_what_the_matrix_assumes(gw, world):
    """Guards the matrix itself: the victim task is claimed with a live lease, so a
    missing runtime check would let the lease operations succeed."""
    resp = await req(gw, "GET", f"/v1/tasks/{world.claimed['id']}")
    assert resp.body["status"] == "claimed"
    assert resp.body["lease_id"] == world.claimed["lease_id"]
