"""The OpenAPI document as the conformance tests check a gateway against it: the
document a gateway with given settings serves, a part of it with its shared components
written out (`deref`), the schemathesis checks every answer must pass, and the schema
and settings the fuzzing tests generate their requests from (a fixed seed: a failure
repeats, and so does the run's length). The gateway they call runs in a thread of its
own (`gateway_thread`, tests/support/gateways.py), as the `served` fixture of
tests/e2e/conftest.py."""

from __future__ import annotations

from typing import Any

import hypothesis
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.http import openapi
from gateway.http.routes import ENDPOINTS
from tests.support.gateways import JANITOR_OFF, TOKEN, make_settings

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@schemathesis.check
def problem_code_conformance(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """A problem's `code` is one that its answer in the document lists (x-problem-codes),
    and its `status` the answer's: the answer's schema says only that it is a Problem.
    Registered with schemathesis on import, so that the hooks of its own run load it."""
    status = response.status_code
    declared = case.operation.definition.raw["responses"].get(str(status))
    if status < 400 or declared is None:
        return None  # a success, or a status the document does not list (checked apart)
    if "$ref" in declared:
        name = declared["$ref"].rsplit("/", 1)[1]
        declared = case.operation.schema.raw_schema["components"]["responses"][name]
    codes = declared.get(openapi.PROBLEM_CODES)
    if codes is None:
        return None
    problem = response.json()
    if not isinstance(problem, dict) or problem.get("code") not in codes:
        raise AssertionError(f"a {status} answer whose code is not one of {codes}: {problem}")
    if problem.get("status") != status:
        raise AssertionError(f"a {status} answer whose status says otherwise: {problem}")
    return True


# Short long polls: a generated wait_seconds is at most 1.
OVERRIDES: dict[str, Any] = {"max_wait_seconds": 1, "janitor_interval_seconds": JANITOR_OFF}
CONFORMANCE = [
    problem_code_conformance,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def document(**overrides: Any) -> dict[str, Any]:
    """The document a gateway with these settings serves."""
    return openapi.build(ENDPOINTS, make_settings("postgresql://", "redis://", "gw", **overrides))


def check(
    schema: schemathesis.BaseSchema,
    method: str,
    path: str,
    response: Any,
    path_parameters: dict[str, str],
) -> None:
    """The answer of operation `method path` is one its document promises."""
    case = schema[path][method].Case(path_parameters=path_parameters)
    case.validate_response(response, checks=CONFORMANCE)


def deref(node: Any, doc: dict[str, Any]) -> Any:
    """`node` with every `$ref` to a shared response, header or parameter of `doc`
    replaced by what it names; those to schemas are left as they are (JsonValue's
    refers to itself)."""
    if isinstance(node, list):
        return [deref(item, doc) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#/components/schemas/"):
        _, _, kind, name = ref.split("/")
        return deref(
            {**doc["components"][kind][name], **{k: v for k, v in node.items() if k != "$ref"}}, doc
        )
    return {key: deref(value, doc) for key, value in node.items()}


# -- fuzzing -------------------------------------------------------------------------

EXAMPLES_PER_OPERATION = 25
SEED = 20260601
CHECKS = [not_a_server_error, *CONFORMANCE]
# Loaded from the builder rather than from the server: schemathesis.pytest.from_fixture
# fails under pytest 9 (it sets Node._nodeid). A test checks the two agree.
DOCUMENT = document(**OVERRIDES)

schema = schemathesis.openapi.from_dict(DOCUMENT)
schema.config.update(headers=AUTH)
schema.config.seed = SEED
schema.config.generation.update(
    max_examples=EXAMPLES_PER_OPERATION, deterministic=True, database="none"
)
fuzz_settings = hypothesis.settings(
    max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None
)
