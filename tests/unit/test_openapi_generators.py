"""The OpenAPI document as client generators read it (openapi-python-client,
openapi-typescript): every schema and enum named once, answers and bodies named, no
`default` (generators make such a field required, or send it), a claimed task's lease
required outright, examples that their schemas accept. `make clients-check` runs the
generators themselves."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from gateway.api import render
from gateway.http import openapi
from gateway.http.routes import ENDPOINTS
from gateway.settings import Settings
from tests.support.openapi import OVERRIDES, deref


def build(**overrides: Any) -> dict[str, Any]:
    settings = Settings(database_url="postgresql://", redis_url="redis://", auth_enabled=False)
    return openapi.build(ENDPOINTS, dataclasses.replace(settings, **overrides))


DOC = build()


def test_a_claimed_task_requires_its_lease() -> None:
    """Generators do not read the Task's if/then: a claim's tasks are ClaimedTasks, whose
    lease fields are required outright."""
    claimed = DOC["components"]["schemas"]["ClaimedTask"]
    assert set(claimed["required"]) == set(render.TASK_FIELDS) | set(render.LEASE_FIELDS)
    assert claimed["properties"]["status"] == {"type": "string", "const": "claimed"}
    answer = DOC["paths"]["/v1/runtimes/{rt}/claim"]["post"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ClaimedTaskList"
    }
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/ClaimedTask", "components": DOC["components"]}
    )
    example = claimed["examples"][0]
    assert validator.is_valid(example)
    assert not validator.is_valid({k: v for k, v in example.items() if k != "lease_id"})


@pytest.mark.parametrize("overrides", [{}, OVERRIDES], ids=["defaults", "fuzzed"])
def test_every_example_is_valid(overrides: dict[str, Any]) -> None:
    """An example that its schema refuses would teach a reader a request that fails,
    and schemathesis sends every example."""
    doc = build(**overrides)
    schemas = doc["components"]["schemas"]
    with_examples = [name for name, schema in schemas.items() if "examples" in schema]
    assert {"Task", "ClaimedTask", "EnqueueRequest", "ClaimRequest", "TokenRequest"} <= set(
        with_examples
    )
    for name in with_examples:
        validator = jsonschema.Draft202012Validator(
            {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
        )
        for example in schemas[name]["examples"]:
            errors_ = list(validator.iter_errors(example))
            assert not errors_, (name, errors_)


def test_no_schema_states_a_default() -> None:
    """A `default` makes a field required in generated TypeScript, and generated Python
    clients send it on every request: defaults are stated in words only."""
    found = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "default" in node and isinstance(node.get("type", ""), str | list):
                found.append(where)
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    walk(build(default_lease_seconds=42), "")
    assert not found, found


# --- what client generators need ----------------------------------------------------------


def walk(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, schema-like dict) for every dict in `node`, depth first."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from walk(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{where}/{i}")


def test_every_enum_is_named_once_with_its_type() -> None:
    """An inline enum becomes a type of its own in each place a generator meets it
    (three incompatible task statuses, as ListTokensResponse200TokensItemScopesItem)."""
    schemas = DOC["components"]["schemas"]
    # An `if` tests a value, and declares no type: generators read no further.
    inline = [where for where, node in walk(DOC) if "enum" in node and "/if/" not in where]
    named = {f"/components/schemas/{name}" for name, s in schemas.items() if "enum" in s}
    assert set(inline) == named
    for name in named:
        schema = schemas[name.rsplit("/", 1)[1]]
        assert schema["type"] == "string" and schema["description"], name
    assert {"TaskStatus", "Scope", "ProblemCode"} <= {n.rsplit("/", 1)[1] for n in named}
    lists = [tuple(schemas[n.rsplit("/", 1)[1]]["enum"]) for n in named]
    assert len(lists) == len(set(lists)), "two enums list the same values"


def test_answers_and_bodies_are_named_schemas() -> None:
    """Every JSON body, asked or answered, is a schema of the components (generated
    names like EnqueueTaskResponse201 come from inline ones)."""
    for path, item in DOC["paths"].items():
        for method, operation in deref(item, DOC).items():
            bodies_ = [operation.get("requestBody", {})]
            bodies_ += list(operation["responses"].values())
            for body in bodies_:
                for media, content in body.get("content", {}).items():
                    if media != "text/plain":
                        assert set(content["schema"]) == {"$ref"}, (method, path, media)


def test_error_answers_and_headers_are_shared_components() -> None:
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400 and "$ref" not in response:
                    assert "application/problem+json" not in response.get("content", {})
                for header in response.get("headers", {}).values():
                    assert set(header) == {"$ref"}, (method, path, status)
    shared = DOC["components"]["parameters"]
    assert {"rt", "task_id", "Prefer", "include_revoked"} <= set(shared)


def test_servers_and_tags() -> None:
    assert DOC["servers"] == [{"url": "/", "description": DOC["servers"][0]["description"]}]
    tags = {tag["name"]: tag["description"] for tag in DOC["tags"]}
    assert all(tags.values())
    used = {tag for item in DOC["paths"].values() for op in item.values() for tag in op["tags"]}
    assert used == set(tags)
