"""The OpenAPI document: valid OpenAPI 3.1, every endpoint documented, every problem
code listed, the app's settings in its bounds."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate

from gateway import errors
from gateway.api import bodies, decode, render, requests
from gateway.api.credential_bodies import Scope
from gateway.api.fields import Kind, RawBody, read_query
from gateway.errors import ValidationFailed
from gateway.http import docs, openapi
from gateway.http.handlers import batch
from gateway.http.handlers.operations import healthz
from gateway.http.routes import ENDPOINTS, Endpoint, Target
from gateway.settings import Settings
from tests.support.openapi import deref


def build(**overrides: Any) -> dict[str, Any]:
    settings = Settings(database_url="postgresql://", redis_url="redis://", auth_enabled=False)
    return openapi.build(ENDPOINTS, dataclasses.replace(settings, **overrides))


DOC = build()
OPERATIONS = [(e, DOC["paths"][e.path][e.method.lower()]) for e in ENDPOINTS]


def ids(value: Any) -> str:
    return f"{value.method} {value.path}" if isinstance(value, Endpoint) else ""


def schema_of(ref: dict[str, Any]) -> dict[str, Any]:
    name = ref["$ref"].rsplit("/", 1)[1]
    schema: dict[str, Any] = DOC["components"]["schemas"][name]
    return schema


OPERATIONS = [(e, deref(operation, DOC)) for e, operation in OPERATIONS]


def test_the_document_is_valid_openapi_3_1() -> None:
    assert DOC["openapi"] == "3.1.0"
    validate(DOC)


def test_every_endpoint_is_documented() -> None:
    """A new Endpoint needs a Doc: an operationId, a summary and its success answers."""
    for endpoint in ENDPOINTS:
        where = f"{endpoint.method} {endpoint.path}"
        assert endpoint.doc is not None, f"{where} has no doc=docs.Doc(...)"
        assert endpoint.doc.operation_id and endpoint.doc.summary, where
        assert any(200 <= r.status < 300 for r in endpoint.doc.replies), where
    operation_ids = [e.doc.operation_id for e in ENDPOINTS if e.doc]
    assert len(set(operation_ids)) == len(operation_ids)


def test_an_undocumented_endpoint_fails_the_build() -> None:
    bare = Endpoint("GET", "/v1/new", healthz, Scope.ADMIN)
    with pytest.raises(ValueError, match="GET /v1/new has no Doc"):
        openapi.build([*ENDPOINTS, bare], Settings(auth_enabled=False))


def test_an_undocumented_path_parameter_fails_the_build() -> None:
    odd = Endpoint("GET", "/v1/things/{thing}", healthz, None, doc=docs.HEALTHZ)
    with pytest.raises(ValueError, match="thing"):
        openapi.build([odd], Settings(auth_enabled=False))


def test_every_endpoint_appears_with_its_method() -> None:
    documented = {(m.upper(), p) for p, item in DOC["paths"].items() for m in item}
    assert documented == {(e.method, e.path) for e in ENDPOINTS}
    assert ("GET", "/openapi.json") in documented


@pytest.mark.parametrize(("endpoint", "operation"), OPERATIONS, ids=ids)
def test_security_and_scope(endpoint: Endpoint, operation: dict[str, Any]) -> None:
    assert endpoint.doc is not None
    if endpoint.scope is None and errors.InvalidSignature in endpoint.doc.errors:
        assert operation["security"] == []
        assert "No bearer token" in operation["description"]
        assert "WWW-Authenticate" in operation["responses"]["401"]["headers"]
    elif endpoint.scope is None:
        assert operation["security"] == []
        assert "No authentication" in operation["description"]
        assert "401" not in operation["responses"]
    else:
        assert operation["security"] == [{"bearer": []}]
        assert f"`{endpoint.scope}` scope" in operation["description"]
        assert "WWW-Authenticate" in operation["responses"]["401"]["headers"]
    assert DOC["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}


def test_every_problem_code_appears() -> None:
    # ProblemCode names every code; the field stays open to codes a later release adds,
    # so that a generated client does not fail on a value its enum lacks.
    assert DOC["components"]["schemas"]["Problem"]["properties"]["code"]["anyOf"] == [
        {"$ref": "#/components/schemas/ProblemCode"},
        {"type": "string"},
    ]
    codes = DOC["components"]["schemas"]["ProblemCode"]["enum"]
    defined = {
        v.code
        for v in vars(errors).values()
        if isinstance(v, type) and issubclass(v, errors.GatewayError)
    }
    assert set(codes) == defined
    assert {"lease_lost", "invalid_state", "idempotency_key_reused", "internal_error"} <= defined


@pytest.mark.parametrize(("endpoint", "operation"), OPERATIONS, ids=ids)
def test_error_answers_are_problems_with_their_codes(
    endpoint: Endpoint, operation: dict[str, Any]
) -> None:
    problems = 0
    for status, response in operation["responses"].items():
        content = response.get("content", {}).get("application/problem+json")
        if content is None:
            continue
        problems += 1
        assert content["schema"] == {"$ref": "#/components/schemas/Problem"}
        for code in response[openapi.PROBLEM_CODES]:
            cls = next(c for c in openapi.error_classes() if c.code == code)
            assert openapi.status_of(cls) == int(status)
            assert f"`{code}`" in response["description"]
    assert problems and "500" in operation["responses"]


def responses(path: str, method: str = "post") -> dict[str, Any]:
    answers: dict[str, Any] = deref(DOC["paths"][path][method]["responses"], DOC)
    return answers


def codes(path: str, status: str, method: str = "post") -> set[str]:
    return set(responses(path, method)[status][openapi.PROBLEM_CODES])


def test_what_each_operation_can_answer() -> None:
    assert set(responses("/v1/runtimes/{rt}/claim")) == {
        "200", "400", "401", "403", "404", "408", "413", "422", "429", "500", "503",
    }  # fmt: skip
    assert codes("/v1/runtimes/{rt}/claim", "503") == {"draining", "store_unavailable"}
    assert responses("/v1/runtimes/{rt}/claim")["429"]["headers"]["Retry-After"]["required"]
    assert codes("/v1/runtimes/{rt}/tasks", "422") == {
        "validation_failed",
        "idempotency_key_reused",
    }
    assert codes("/v1/tasks/{task_id}/complete", "409") == {"lease_lost"}
    assert codes("/v1/tasks/{task_id}/retry", "409") == {"invalid_state"}
    assert set(responses("/v1/tasks/{task_id}", "get")) == {
        "200",
        "401",
        "403",
        "404",
        "422",  # wait_seconds out of range
        "429",  # GATEWAY_MAX_PARKED_POLLS requests already wait
        "500",
        "503",
    }
    assert responses("/v1/tasks/{task_id}", "get")["429"]["headers"]["Retry-After"]["required"]
    assert set(responses("/healthz", "get")) == {"200", "500"}
    ready = responses("/readyz", "get")["503"]["content"]
    assert ready == {"application/json": {"schema": {"$ref": "#/components/schemas/NotReady"}}}
    assert "text/plain" in responses("/metrics", "get")["200"]["content"]


def test_enqueue_documents_the_replay_header_and_the_idempotency_key_header() -> None:
    operation = deref(DOC["paths"]["/v1/runtimes/{rt}/tasks"]["post"], DOC)
    assert operation["responses"]["200"]["headers"]["Idempotent-Replayed"]["schema"] == {
        "type": "string",
        "const": "true",
    }
    assert set(operation["responses"]["201"]["headers"]) == {"X-Request-ID", "Preference-Applied"}
    (header,) = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["in"] == "header" and header["schema"]["maxLength"] == 200


@pytest.mark.parametrize("path", ["/v1/runtimes/{rt}/tasks", "/v1/runtimes/{rt}/tasks:batch"])
def test_enqueues_document_prefer_return_minimal_and_its_answers(path: str) -> None:
    operation = deref(DOC["paths"][path]["post"], DOC)
    (prefer,) = [p for p in operation["parameters"] if p["name"] == "Prefer"]
    assert prefer["in"] == "header" and "return=minimal" in prefer["description"]
    answer, whole, minimal = (
        ("EnqueuedTask", "Task", "TaskRef")
        if path.endswith("tasks")
        else ("EnqueuedTasks", "TaskList", "TaskRefList")
    )
    for status in ("200", "201"):
        reply = operation["responses"][status]
        applied = reply["headers"]["Preference-Applied"]
        assert applied["schema"] == {"type": "string", "const": "return=minimal"}
        assert not applied["required"]
        schema = reply["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{answer}"}
    schemas = DOC["components"]["schemas"]
    assert schemas[answer]["oneOf"] == [
        {"$ref": f"#/components/schemas/{whole}"},
        {"$ref": f"#/components/schemas/{minimal}"},
    ]
    assert schemas["TaskRef"]["required"] == ["id"]
    assert schemas["TaskRef"]["additionalProperties"] is False
    assert schemas["TaskRefList"]["properties"]["tasks"]["items"] == {
        "$ref": "#/components/schemas/TaskRef"
    }


def test_a_batch_answer_matches_exactly_one_of_its_two_forms() -> None:
    """The batch's answer schema is a oneOf, so a list of ids must not also read as a
    list of tasks. A batch is never empty (an empty list would match both forms), and
    the schema says so for readers and client generators."""
    schemas = DOC["components"]["schemas"]
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/EnqueuedTasks", "components": DOC["components"]}
    )
    assert schemas["TaskList"]["properties"]["tasks"]["minItems"] == 1
    assert schemas["TaskRefList"]["properties"]["tasks"]["minItems"] == 1
    task_id = "0196f2b0-43c1-7b5e-9d4a-1f3c2b8e6a01"
    assert validator.is_valid({"tasks": [{"id": task_id}]})
    assert not validator.is_valid({"tasks": []})
    assert not validator.is_valid({"tasks": [{"id": task_id, "payload": {}}]})
    example = schemas["Task"]["examples"][0]
    assert validator.is_valid({"tasks": [example]})


def test_path_parameters() -> None:
    for path, item in DOC["paths"].items():
        for operation in deref(item, DOC).values():
            params = {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "path"}
            assert set(params) == set(re.findall(r"{(\w+)}", path))
            if "rt" in params:
                assert params["rt"]["schema"]["pattern"] == decode.RUNTIME_ID_RE.pattern
            if "task_id" in params:
                assert params["task_id"]["schema"]["format"] == "uuid"


def test_settings_bounds_show_up() -> None:
    doc = build(
        max_wait_seconds=5, default_lease_seconds=42, max_payload_bytes=1234, max_json_depth=7
    )
    schemas = doc["components"]["schemas"]
    claim = schemas["ClaimRequest"]["properties"]
    assert claim["wait_seconds"]["maximum"] == 5
    assert "GATEWAY_MAX_WAIT_SECONDS" in claim["wait_seconds"]["description"]
    # In words only: a `default` would make generated clients send this server's value.
    for body in ("ClaimRequest", "HeartbeatRequest"):
        lease = schemas[body]["properties"]["lease_seconds"]
        assert "default" not in lease and documented_default(lease) == 42
        assert "GATEWAY_DEFAULT_LEASE_SECONDS" in lease["description"]
    payload = schemas["EnqueueRequest"]["properties"]["payload"]["description"]
    assert "1234 bytes" in payload and "7 levels" in payload
    item = schemas["EnqueueBatchRequest"]["properties"]["tasks"]["items"]
    assert item == {"$ref": "#/components/schemas/EnqueueRequest"}
    assert (
        build()["components"]["schemas"]["ClaimRequest"]["properties"]["wait_seconds"]["maximum"]
        == Settings().max_wait_seconds
    )


def test_request_bodies_come_from_the_field_specs() -> None:
    schemas = DOC["components"]["schemas"]
    enqueue = schemas["EnqueueRequest"]
    assert enqueue["required"] == ["payload"]
    assert enqueue["properties"]["priority"]["minimum"] == 0
    assert enqueue["properties"]["priority"]["maximum"] == 1000
    assert documented_default(enqueue["properties"]["priority"]) == 50
    assert enqueue["properties"]["run_at"]["format"] == "date-time"
    batch = schemas["EnqueueBatchRequest"]["properties"]["tasks"]
    assert (batch["minItems"], batch["maxItems"]) == (1, bodies.MAX_BATCH)
    assert schemas["FailRequest"]["required"] == ["lease_id", "error"]
    listing = deref(DOC["paths"]["/v1/runtimes/{rt}/tasks"]["get"]["parameters"], DOC)
    status = next(p for p in listing if p["name"] == "status")
    assert status["schema"] == {"$ref": "#/components/schemas/TaskStatus"}
    assert schemas["TaskStatus"] == {
        "type": "string",
        "enum": list(bodies.STATUSES),
        "description": schemas["TaskStatus"]["description"],
    }
    for endpoint, operation in OPERATIONS:
        assert endpoint.doc is not None
        if endpoint.doc.body is None:
            assert "requestBody" not in operation
        else:
            assert schema_of(operation["requestBody"]["content"]["application/json"]["schema"])


def test_the_task_schema_lists_every_field_the_api_returns() -> None:
    task = DOC["components"]["schemas"]["Task"]
    assert set(task["required"]) == set(render.TASK_FIELDS)
    shown = set(render.TASK_FIELDS) | set(render.LEASE_FIELDS)
    optional = {"result", "last_error", "render_error", "schedule", "scheduled_for", "trace"}
    assert shown | optional == set(task["properties"])
    assert task["properties"]["status"] == {"$ref": "#/components/schemas/TaskStatus"}
    assert task["additionalProperties"] is False


def test_a_route_can_declare_a_raw_body_and_its_own_path_parameters() -> None:
    """What a webhook taking any JSON at /v1/runtimes/{rt}/webhooks/{source} would use."""
    webhook = docs.Doc(
        "receiveWebhook",
        "Receive a signed webhook",
        (docs.Reply(202, "Accepted.", {"type": "object"}),),
        body=RawBody("WebhookPayload", "The event, any JSON, exactly as signed.", {}),
        path_params=(docs.Param("source", "Who sends it.", {"type": "string"}),),
        errors=(errors.Forbidden,),
    )
    endpoint = Endpoint(
        "POST", "/v1/runtimes/{rt}/webhooks/{source}", healthz, None, Target.RUNTIME, webhook
    )
    doc = openapi.build([endpoint], Settings(auth_enabled=False))
    validate(doc)
    operation = doc["paths"][endpoint.path]["post"]
    assert [p["name"] for p in operation["parameters"]] == ["rt", "source"]
    assert doc["components"]["schemas"]["WebhookPayload"] == {
        "description": "The event, any JSON, exactly as signed."
    }
    assert {"202", "400", "403", "404", "408", "413", "422", "500"} == set(operation["responses"])


def test_two_bodies_may_not_share_a_name() -> None:
    other = dataclasses.replace(
        docs.CLAIM, body=dataclasses.replace(docs.HEARTBEAT.body, name="ClaimRequest")
    )
    clash = Endpoint("POST", "/v1/other", healthz, None, doc=other)
    with pytest.raises(ValueError, match="ClaimRequest"):
        openapi.build([*ENDPOINTS, clash], Settings(auth_enabled=False))


# --- the documented rules are the enforced rules ------------------------------------------

MAX_PAYLOAD = 1_048_576
LEASE = "11111111-2222-4333-8444-555555555555"

WAIT, LEASE_DEFAULT = 60.0, 45
PARSERS: dict[str, tuple[Callable[[dict[str, Any]], Any], dict[str, Any]]] = {
    "EnqueueRequest": (lambda b: requests.parse_enqueue(b, None, MAX_PAYLOAD), {"payload": 1}),
    "EnqueueBatchRequest": (
        lambda b: requests.parse_batch(b, MAX_PAYLOAD),
        {"tasks": [{"payload": 1}]},
    ),
    "ClaimRequest": (
        lambda b: (
            requests.parse_claim(b, WAIT, LEASE_DEFAULT),
            batch.parse_acks(b, Settings(max_payload_bytes=MAX_PAYLOAD)),
        ),
        {"worker_id": "w"},
    ),
    "HeartbeatRequest": (
        lambda b: (requests.parse_lease_id(b), requests.parse_lease_seconds(b, LEASE_DEFAULT)),
        {"lease_id": LEASE},
    ),
    "CompleteRequest": (
        lambda b: (requests.parse_lease_id(b), requests.result_json(b, MAX_PAYLOAD)),
        {"lease_id": LEASE},
    ),
    "FailRequest": (requests.parse_fail, {"lease_id": LEASE, "error": "e"}),
    "ReleaseRequest": (requests.parse_lease_id, {"lease_id": LEASE}),
    "RuntimeControls": (requests.parse_controls, {"paused": True}),
    "Pause": (requests.parse_pause, {}),
}
LIMITS = {
    "max_wait_seconds": WAIT,
    "default_lease_seconds": LEASE_DEFAULT,
    "max_payload_bytes": MAX_PAYLOAD,
    "max_json_depth": decode.DEFAULT_MAX_DEPTH,
}


def array_items(spec: bodies.Body, n: int) -> list[dict[str, Any]]:
    """`n` valid items for an array field of `spec`: tasks to enqueue, or, for a claim's
    `complete` and `fail`, distinct tasks to report (each item fits both)."""
    if spec is bodies.CLAIM_BODY:
        return [{"id": str(uuid.uuid4()), "lease_id": LEASE, "error": "e"} for _ in range(n)]
    return [{"payload": 1}] * n


def documented_cases() -> list[tuple[str, str, Any, bool]]:
    """(body, field, value, accepted) for each documented bound of each body field."""
    bodies_ = list(vars(bodies).values())
    specs = [v for v in bodies_ if isinstance(v, bodies.Body) and v.name in PARSERS]
    assert {s.name for s in specs} == set(PARSERS)
    out = []
    for spec in specs:
        for name, prop in spec.json_schema(LIMITS)["properties"].items():
            step = 1 if "integer" in prop.get("type", "") else 0.5
            if "minimum" in prop:
                out += [(spec.name, name, prop["minimum"], True)]
                out += [(spec.name, name, prop["minimum"] - step, False)]
            if "maximum" in prop:
                out += [(spec.name, name, prop["maximum"], True)]
                out += [(spec.name, name, prop["maximum"] + step, False)]
            if "maxLength" in prop and "format" not in prop:
                out += [(spec.name, name, "k" * prop["maxLength"], True)]
                out += [(spec.name, name, "k" * (prop["maxLength"] + 1), False)]
            if "maxItems" in prop:
                out += [(spec.name, name, array_items(spec, prop["maxItems"]), True)]
                out += [(spec.name, name, array_items(spec, prop["maxItems"] + 1), False)]
                out += [(spec.name, name, [], prop["minItems"] == 0)]
            if name in spec.json_schema(LIMITS).get("required", []):
                out += [(spec.name, name, None, False)]
    return out


@pytest.mark.parametrize(("body", "field", "value", "accepted"), documented_cases())
def test_documented_bounds_are_enforced(body: str, field: str, value: Any, accepted: bool) -> None:
    parse, base = PARSERS[body]
    sent = {**base, field: value} if value is not None else {k: base[k] for k in base if k != field}
    if accepted:
        parse(sent)
    else:
        with pytest.raises(ValidationFailed) as info:
            parse(sent)
        assert info.value.extra["field"] == field


def documented_default(schema: dict[str, Any]) -> Any:
    """The default a field's description states ("Left out: 50.")."""
    found = re.search(
        r"Left out: (?:the server's default, )?([-\w]+(?:\.\d+)?)(?:\.| here)",
        schema["description"],
    )
    assert found, schema["description"]
    return json.loads(found.group(1))


def test_documented_defaults_are_applied() -> None:
    req = requests.parse_claim({"worker_id": "w"}, WAIT, LEASE_DEFAULT)
    schema = bodies.CLAIM_BODY.json_schema(LIMITS)["properties"]
    assert (req.max_tasks, req.wait_seconds, req.lease_seconds) == (
        documented_default(schema["max_tasks"]),
        documented_default(schema["wait_seconds"]),
        documented_default(schema["lease_seconds"]),
    )
    task = bodies.ENQUEUE_BODY.json_schema(LIMITS)["properties"]
    req = requests.parse_enqueue({"payload": 1}, None, MAX_PAYLOAD)
    assert (req.priority, req.max_attempts) == (
        documented_default(task["priority"]),
        documented_default(task["max_attempts"]),
    )
    fail = bodies.FAIL_BODY.json_schema(LIMITS)["properties"]
    assert requests.parse_fail({"lease_id": LEASE, "error": "e"}).retry is True
    assert documented_default(fail["retry"]) is True


def test_every_answer_documents_its_request_id() -> None:
    for path, item in DOC["paths"].items():
        for method, operation in deref(item, DOC).items():
            for status, response in operation["responses"].items():
                header = response["headers"]["X-Request-ID"]
                assert header["required"], (method, path, status)


QUERIES = [docs.LIST_TASKS.query, docs.GET_TASK.query, docs.LIST_RUNTIMES.query]
QUERY_FIELDS = [f for q in QUERIES if q is not None for f in q.fields]


@pytest.mark.parametrize("field", QUERY_FIELDS, ids=lambda f: f.name)
def test_a_query_parameter_is_read_by_its_field(field: Any) -> None:
    """Absent reads as the documented default; empty, or not of its kind, is refused
    naming it, as the document's schema (no empty string validates) says."""
    schema = field.json_schema(LIMITS, nullable=False)
    default = documented_default(schema) if field.default is not None else None
    assert read_query(field, {}, LIMITS) == default
    validator = jsonschema.Draft202012Validator({**schema, "components": DOC["components"]})
    assert not validator.is_valid("")
    for raw in ("", "x" if field.kind is not Kind.STRING else "\x00"):
        with pytest.raises(ValidationFailed) as info:
            read_query(field, {field.name: raw}, LIMITS)
        assert info.value.extra["field"] == field.name
    if "maximum" in schema:
        assert read_query(field, {field.name: str(schema["maximum"])}, LIMITS) == schema["maximum"]
        for raw in (str(schema["maximum"] + 1), "9" * 5000, "-1"):
            with pytest.raises(ValidationFailed):
                read_query(field, {field.name: raw}, LIMITS)
