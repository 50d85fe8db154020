"""The OpenAPI 3.1 document, built from the endpoint table, the request field specs and
the answer schemas in docs.py, with the bounds that come from this app's settings.

Error answers are derived, not written per operation: every endpoint can fail (500);
an authenticated one can be 401, 403 and 503; one with path parameters 404 (and 422
for a bad runtime id); one that reads a body 400, 408, 413 and 422; and each adds the
errors its Doc lists. Their statuses and codes come from errors.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from .. import __version__, errors
from ..api.answers import SCHEMAS
from ..api.credential_bodies import Scope
from ..api.decode import RUNTIME_ID_RE
from ..api.fields import JSON_VALUE, JSON_VALUE_SCHEMA
from ..errors import GatewayError
from ..settings import Settings
from .docs import Doc, Link, Param, Reply

PATH_PARAMS = {
    "rt": Param(
        "rt",
        "The runtime id: 1-128 letters, digits and . _ : -, starting with a letter or digit.",
        {"type": "string", "pattern": RUNTIME_ID_RE.pattern},
    ),
    "task_id": Param("task_id", "The task's id.", {"type": "string", "format": "uuid"}),
}
# Response headers an error answer carries (see GatewayError.headers).
ERROR_HEADERS = {
    "WWW-Authenticate": Param(
        "WWW-Authenticate", "The scheme expected (RFC 6750).", {"type": "string"}, True
    ),
    "Retry-After": Param(
        "Retry-After", "Seconds to wait before retrying.", {"type": "integer", "minimum": 0}, True
    ),
}
PROBLEM_TYPE = "application/problem+json"
# Every answer carries it (gateway/http/access.py); the request's own is kept when sane.
REQUEST_ID = Param(
    "X-Request-ID",
    "The request's id, in every log line written while serving it: the request's own "
    "X-Request-ID when it is 1-128 of A-Z a-z 0-9 . _ : -, otherwise a generated one.",
    {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
    True,
)


class Documented(Protocol):
    """What the builder needs of routes.Endpoint."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def scope(self) -> Scope | None: ...
    @property
    def target(self) -> Any: ...  # routes.Target
    @property
    def doc(self) -> Doc | None: ...


def error_classes() -> list[type[GatewayError]]:
    """Every error class errors.py defines, GatewayError (500) included."""
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, GatewayError)
    ]


def status_of(cls: type[GatewayError]) -> int:
    """The HTTP status errors.problem_for gives this class."""
    for base in cls.__mro__:
        if base in errors.PROBLEMS:
            return errors.PROBLEMS[base][0]
    return 500


def _error_headers(cls: type[GatewayError]) -> list[str]:
    try:
        return list(cls("documentation").headers())
    except TypeError:  # a constructor that needs more: it documents no headers
        return []


def operation_errors(endpoint: Documented) -> list[type[GatewayError]]:
    """The error classes an endpoint can answer with, in a stable order."""
    assert endpoint.doc is not None
    found: list[type[GatewayError]] = [GatewayError]
    if endpoint.scope is not None:
        # Tokens and every authenticated operation reach the database.
        found += [errors.Unauthorized, errors.Forbidden, errors.StoreUnavailable]
    if "{rt}" in endpoint.path:
        found += [errors.ValidationFailed]  # a runtime id that does not match
    if "{" in endpoint.path:
        # An unknown task; or a path parameter holding a slash, which no route matches.
        found += [errors.NotFound]
    if endpoint.doc.body is not None:
        found += [errors.BadRequest, errors.RequestTimeout, errors.PayloadTooLarge]
        found += [errors.ValidationFailed]
    if endpoint.doc.query is not None:
        found += [errors.ValidationFailed]
    found += endpoint.doc.errors
    return list(dict.fromkeys(found))


def build(endpoints: Iterable[Documented], settings: Settings) -> dict[str, Any]:
    """The whole document. Raises ValueError for an endpoint without documentation."""
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {}
    for endpoint in endpoints:
        if endpoint.doc is None:
            raise ValueError(f"{endpoint.method} {endpoint.path} has no Doc (see docs.py)")
        item = paths.setdefault(endpoint.path, {})
        item[endpoint.method.lower()] = _operation(endpoint, endpoint.doc, settings, schemas)
    schemas.update(SCHEMAS)
    schemas[JSON_VALUE] = JSON_VALUE_SCHEMA
    schemas["Problem"] = _problem_schema()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "claim-gateway",
            "version": __version__,
            "description": "Daemons long-poll for tasks from a Postgres task table. Every "
            "error is application/problem+json with a machine-readable `code`; an unknown "
            "path is 404 and a method a path does not have is 405, both as problem+json. "
            "Every answer carries an X-Request-ID header.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(
    endpoint: Documented, doc: Doc, settings: Settings, schemas: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": doc.operation_id,
        "summary": doc.summary,
        "description": _description(endpoint, doc),
        "tags": [doc.tag],
        "security": [{"bearer": []}] if endpoint.scope is not None else [],
    }
    parameters = [_path_param(name, doc) for name in re.findall(r"{(\w+)}", endpoint.path)]
    if doc.query is not None:
        limits = _limits(doc.query.settings(), settings)
        parameters += [_param(f, "query", limits) for f in doc.query.fields]
    parameters += [_param(f, "header", {}) for f in doc.headers]
    if parameters:
        out["parameters"] = parameters
    if doc.body is not None:
        body = doc.body.json_schema(_limits(doc.body.settings(), settings))
        if schemas.setdefault(doc.body.name, body) != body or doc.body.name in SCHEMAS:
            raise ValueError(f"two different schemas are named {doc.body.name}")
        out["requestBody"] = {
            "required": doc.body.required,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{doc.body.name}"}}
            },
        }
    responses: dict[str, Any] = {}
    for reply in doc.replies:
        _add(responses, reply.status, reply.description, reply.media_type, _schema(reply))
        for header in reply.headers:
            _header(responses, reply.status, header)
        for link in reply.links:
            _link(responses, reply.status, link)
    by_status: dict[int, list[type[GatewayError]]] = {}
    for cls in operation_errors(endpoint):
        by_status.setdefault(status_of(cls), []).append(cls)
    for status, classes in sorted(by_status.items()):
        _add(responses, status, _problem_text(classes), PROBLEM_TYPE, _problem(status, classes))
        for cls in classes:
            for name in _error_headers(cls):
                default = Param(name, "", {"type": "string"}, required=True)
                _header(responses, status, ERROR_HEADERS.get(name, default))
    for code in responses:
        _header(responses, int(code), REQUEST_ID)
    out["responses"] = dict(sorted(responses.items()))
    return out


def _description(endpoint: Documented, doc: Doc) -> str:
    if endpoint.scope is None:
        signed = any(issubclass(cls, errors.Unauthorized) for cls in doc.errors)
        access = (
            "No bearer token: the handler checks the request's own credentials."
            if signed
            else "No authentication."
        )
    else:
        access = f"Needs a bearer token with the `{endpoint.scope}` scope (or `admin`)"
        if "{rt}" in endpoint.path:
            access += " whose runtimes cover `rt`; another runtime is 403."
        elif "{task_id}" in endpoint.path:
            access += " whose runtimes cover the task's; another runtime's task is 404."
        else:
            access += "."
    return f"{doc.description}\n\n{access}".strip()


def _limits(names: Iterable[str], settings: Settings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in names}


def _path_param(name: str, doc: Doc) -> dict[str, Any]:
    declared = {p.name: p for p in doc.path_params}
    param = declared.get(name) or PATH_PARAMS.get(name)
    if param is None:
        raise ValueError(f"path parameter {{{name}}} of {doc.operation_id} is not documented")
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": param.description,
        "schema": dict(param.schema),
    }


def _param(field: Any, where: str, limits: Mapping[str, Any]) -> dict[str, Any]:
    schema = field.json_schema(limits, nullable=False)
    return {
        "name": field.name,
        "in": where,
        "required": field.required,
        "description": schema.pop("description"),
        "schema": schema,
    }


def _schema(reply: Reply) -> dict[str, Any] | None:
    if reply.schema is None:
        return None
    if isinstance(reply.schema, str):
        return {"$ref": f"#/components/schemas/{reply.schema}"}
    return dict(reply.schema)


def _add(
    responses: dict[str, Any], status: int, text: str, media: str, schema: dict[str, Any] | None
) -> None:
    """An answer; `schema` None: one without a body (204)."""
    entry = responses.setdefault(str(status), {"description": text})
    if text not in entry["description"]:
        entry["description"] += " " + text
    if schema is not None:
        entry.setdefault("content", {})[media] = {"schema": schema}


def _header(responses: dict[str, Any], status: int, header: Param) -> None:
    headers = responses[str(status)].setdefault("headers", {})
    headers[header.name] = {
        "description": header.description,
        "required": header.required,
        "schema": dict(header.schema),
    }


def _link(responses: dict[str, Any], status: int, link: Link) -> None:
    out: dict[str, Any] = {"operationId": link.operation_id, "parameters": dict(link.parameters)}
    if link.request_body is not None:
        out["requestBody"] = dict(link.request_body)
    responses[str(status)].setdefault("links", {})[link.name] = out


def _problem(status: int, classes: Sequence[type[GatewayError]]) -> dict[str, Any]:
    return {
        "allOf": [{"$ref": "#/components/schemas/Problem"}],
        "properties": {
            "status": {"const": status},
            "code": {"enum": sorted({cls.code for cls in classes})},
        },
    }


def _problem_text(classes: Sequence[type[GatewayError]]) -> str:
    """The codes, each with the first line of its class's docstring."""
    parts = []
    for cls in classes:
        if cls is GatewayError:
            line = "the gateway failed unexpectedly; the error is in its log."
        else:
            # The first sentence of the class's docstring.
            line = re.split(r"(?<=\.)\s", " ".join((cls.__doc__ or "").split()), maxsplit=1)[0]
        parts.append(f"`{cls.code}`" + (f": {line}" if line else ""))
    return " ".join(parts)


def _problem_schema() -> dict[str, Any]:
    schema = dict(SCHEMAS["Problem"])
    properties = dict(schema["properties"])
    codes = sorted({cls.code for cls in error_classes()})
    properties["code"] = {"enum": codes, "description": "The machine-readable reason."}
    schema["properties"] = properties
    return schema
