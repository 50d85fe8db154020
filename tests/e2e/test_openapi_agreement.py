"""The served OpenAPI document and the server agree, value by value: what the document
calls valid is accepted, what it calls invalid is refused (422 naming the field), and a
method a path does not have is 405 with an `Allow` listing the methods it has. Each
test walks the document itself, so a new field, query parameter or path is covered
without being named here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from tests.support.credentials import every_token, make_secret, make_token
from tests.support.http import req
from tests.support.lifecycle import UNKNOWN_TASK, assert_problem

pytestmark = pytest.mark.asyncio(loop_scope="module")

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# What each path parameter is filled with: a value its schema allows.
PATH_VALUES = {"rt": "agreement", "task_id": UNKNOWN_TASK}


async def document(gw: Any) -> dict[str, Any]:
    resp = await req(gw, "GET", "/openapi.json")
    assert resp.status == 200, resp.body
    doc: dict[str, Any] = resp.body
    return doc


def concrete(path: str) -> str:
    """The path with its parameters filled in; an id parameter gets a UUID."""
    return re.sub(r"{(\w+)}", lambda m: PATH_VALUES.get(m.group(1), UNKNOWN_TASK), path)


def valid(schema: dict[str, Any], value: Any, doc: dict[str, Any]) -> bool:
    """Whether the document's schema allows `value` (its $refs resolved in `doc`)."""
    validator = jsonschema.Draft202012Validator({**schema, "components": doc["components"]})
    return validator.is_valid(value)


# -- request bodies ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "rate",
    [0, 0.0, -1, 5e-324, 1e-9, 0.000999, 0.001, 0.5, 100_000, 100_000.5],
    ids=lambda rate: repr(rate),
)
async def test_claims_per_second_valid_per_the_document_is_accepted(gw, rate):
    """`claims_per_second` as the document's request schema says: accepted exactly when
    the schema allows it, else 422 naming it."""
    doc = await document(gw)
    operation = doc["paths"]["/v1/runtimes/{rt}/controls"]["patch"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    body = {"claims_per_second": rate}
    resp = await req(gw, "PATCH", "/v1/runtimes/agreement-rate/controls", body)
    if valid(schema, body, doc):
        assert resp.status == 200, (rate, resp.status, resp.body)
    else:
        assert_problem(resp, 422, "validation_failed", "claims_per_second")
    # The answer's schema describes the stored value the same way.
    answer = doc["components"]["schemas"]["Controls"]["properties"]["claims_per_second"]
    assert valid(answer, rate, doc) == valid(schema, body, doc), answer


async def test_the_slowest_rate_still_hands_out_a_task(gw):
    """At the documented minimum the bucket refills without Postgres's float8
    underflowing (a rate of 5e-324, once accepted, failed every claim with 503)."""
    rt = "agreement-slowest"
    resp = await req(gw, "PATCH", f"/v1/runtimes/{rt}/controls", {"claims_per_second": 0.001})
    assert resp.status == 200, resp.body
    enqueued = await req(gw, "POST", f"/v1/runtimes/{rt}/tasks", {"payload": 1})
    assert enqueued.status == 201, enqueued.body
    claimed = await req(gw, "POST", f"/v1/runtimes/{rt}/claim", {"worker_id": "w"})
    assert claimed.status == 200, claimed.body
    assert [t["id"] for t in claimed.body["tasks"]] == [enqueued.body["id"]]


# -- query parameters -------------------------------------------------------------------


def shared(doc: dict[str, Any], param: dict[str, Any]) -> dict[str, Any]:
    """A parameter as declared, or the one its `$ref` names in the components."""
    if "$ref" not in param:
        return param
    found: dict[str, Any] = doc["components"]["parameters"][param["$ref"].rsplit("/", 1)[1]]
    return found


def query_parameters(doc: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if operation["operationId"] == "receiveWebhook":
                continue  # its signature is checked before anything else (401)
            for declared in operation.get("parameters", []):
                param = shared(doc, declared)
                if param["in"] == "query":
                    yield method.upper(), path, param["name"], param["schema"]


async def test_an_empty_query_value_is_422_wherever_the_document_forbids_it(gw):
    """`?name=` for every query parameter of every operation: the document's schema
    refuses an empty string for each of them (a number, a non-empty string, an enum),
    so the server must answer 422 naming the parameter, not read it as absent."""
    doc = await document(gw)
    found = list(query_parameters(doc))
    names = {name for _, _, name, _ in found}
    assert {"cursor", "wait_seconds", "limit", "status", "include_revoked"} <= names, names
    accepted = []
    for method, path, name, schema in found:
        assert not valid(schema, "", doc), (path, name, schema)
        resp = await req(gw, method, f"{concrete(path)}?{name}=")
        if resp.status != 422 or resp.body.get("field") != name:
            accepted.append(f"{method} {path}?{name}= answered {resp.status} {resp.body}")
    assert not accepted, "\n".join(accepted)


# -- methods ----------------------------------------------------------------------------


def served_methods(item: dict[str, Any]) -> set[str]:
    """The methods the server answers on a path: the documented ones, and HEAD beside
    GET (Starlette serves HEAD wherever GET is, and the document leaves it out)."""
    methods = {method.upper() for method in item}
    return methods | {"HEAD"} if "GET" in methods else methods


async def test_a_method_a_path_lacks_is_405_allowing_every_method_it_has(gw):
    """For every path of the document, every other method is 405 with an `Allow` that
    lists exactly the path's methods, however many routes serve them."""
    doc = await document(gw)
    wrong = []
    for path, item in doc["paths"].items():
        allowed = served_methods(item)
        for method in sorted(set(METHODS) - allowed):
            resp = await req(gw, method, concrete(path))
            header = resp.headers.get("Allow", "")
            listed = {m.strip() for m in header.split(",") if m.strip()}
            if resp.status != 405 or listed != allowed:
                wrong.append((method, path, resp.status, header, sorted(allowed)))
            elif method != "HEAD":  # a HEAD answer has no body
                assert_problem(resp, 405, "method_not_allowed")
    assert not wrong, "\n".join(map(str, wrong))


# -- include_revoked --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "revoked"), [("true", True), ("1", True), ("false", False), ("0", False)]
)
async def test_include_revoked_is_a_boolean_also_spelled_1_and_0(gw, spelling, revoked):
    """The document says boolean, which generated clients send as `true` and `false`;
    `1` and `0` are read as before."""
    doc = await document(gw)
    for path, key in (
        ("/v1/admin/tokens", "tokens"),
        ("/v1/admin/webhook-secrets", "webhook_secrets"),
    ):
        declared = [shared(doc, p) for p in doc["paths"][path]["get"]["parameters"]]
        (param,) = [p for p in declared if p["name"] == "include_revoked"]
        assert param["schema"]["type"] == "boolean", param
        made = await (make_token(gw, ["read"]) if key == "tokens" else make_secret(gw, ["a"]))
        assert (await req(gw, "DELETE", f"{path}/{made['id']}")).status == 204
        if key == "tokens":  # paged: every page
            listed, _ = await every_token(gw, f"&include_revoked={spelling}")
        else:
            answer = await req(gw, "GET", f"{path}?include_revoked={spelling}")
            assert answer.status == 200, answer.body
            listed = answer.body[key]
        assert (made["id"] in [item["id"] for item in listed]) is revoked
