"""The OpenAPI 3.1 document, built from the endpoint table, the request field specs and
the answer schemas in docs.py, with the bounds that come from this app's settings.

Error answers are derived, not written per operation: every endpoint can fail (500);
an authenticated one can be 401, 403 and 503; one with path parameters 404 (and 422
for a bad runtime id); one that reads a body 400, 408, 413 and 422; and each adds the
errors its Doc lists. Their statuses and codes come from errors.py.

Written for client generators as well as readers: every schema, enum, error answer and
header is named once in `components` and referred to, as is a parameter several
operations share, so that generated types have one name each.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import __version__, errors
from ..api import trace
from ..api.answers import SCHEMAS
from ..api.credential_bodies import Scope
from ..api.decode import RUNTIME_ID_RE
from ..api.fields import JSON_VALUE, JSON_VALUE_SCHEMA
from ..errors import GatewayError
from ..settings import Settings
from . import admin_docs, bulk_docs, history_docs, load_docs, schedule_docs
from .docs import TAGS, Doc, Link, Param, Reply

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
# The extension on an error answer that lists its problem codes, for tools.
PROBLEM_CODES = "x-problem-codes"
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


@dataclass
class Components:
    """What the operations refer to, each by its name."""

    schemas: dict[str, Any] = field(default_factory=dict)
    responses: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)

    def header(self, header: Param) -> dict[str, str]:
        """A reference to the header, named by itself."""
        entry = {
            "description": header.description,
            "required": header.required,
            "schema": dict(header.schema),
        }
        if self.headers.setdefault(header.name, entry) != entry:
            raise ValueError(f"two different headers are named {header.name}")
        return {"$ref": f"#/components/headers/{header.name}"}


def build(endpoints: Iterable[Documented], settings: Settings) -> dict[str, Any]:
    """The whole document. Raises ValueError for an endpoint without documentation."""
    paths: dict[str, dict[str, Any]] = {}
    components = Components()
    for endpoint in endpoints:
        if endpoint.doc is None:
            raise ValueError(f"{endpoint.method} {endpoint.path} has no Doc (see docs.py)")
        item = paths.setdefault(endpoint.path, {})
        item[endpoint.method.lower()] = _operation(endpoint, endpoint.doc, settings, components)
    schemas = components.schemas
    schemas.update(SCHEMAS)
    schemas.update(admin_docs.SCHEMAS)
    schemas.update(load_docs.SCHEMAS)
    schemas.update(schedule_docs.SCHEMAS)
    schemas.update(bulk_docs.SCHEMAS)
    schemas.update(history_docs.SCHEMAS)
    schemas[JSON_VALUE] = JSON_VALUE_SCHEMA
    schemas[trace.SCHEMA_NAME] = trace.SCHEMA
    schemas["Problem"] = _problem_schema()
    schemas["ProblemCode"] = {
        "type": "string",
        "enum": sorted({cls.code for cls in error_classes()}),
        "description": "A problem's machine-readable reason; each error answer lists its "
        f"own in `{PROBLEM_CODES}`.",
    }
    schemas["OpenAPIDocument"] = {
        "type": "object",
        "description": "An OpenAPI 3.1 document: this one.",
        "required": ["openapi", "info", "paths"],
        "properties": {"openapi": {"type": "string", "pattern": "^3\\.1\\."}},
    }
    _share_parameters(paths, components.parameters)
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
        # Relative: the gateway that serves this document (`gateway serve`).
        "servers": [{"url": "/", "description": "The gateway that served this document."}],
        "tags": [{"name": name, "description": text} for name, text in TAGS.items()],
        "paths": paths,
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "responses": dict(sorted(components.responses.items())),
            "headers": dict(sorted(components.headers.items())),
            "parameters": dict(sorted(components.parameters.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(
    endpoint: Documented, doc: Doc, settings: Settings, components: Components
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
        for name, schema in doc.body.components(_limits(doc.body.settings(), settings)).items():
            if components.schemas.setdefault(name, schema) != schema or name in SCHEMAS:
                raise ValueError(f"two different schemas are named {name}")
        out["requestBody"] = {
            "required": doc.body.required,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{doc.body.name}"}}
            },
        }
    responses: dict[str, Any] = {}
    for reply in doc.replies:
        answer: dict[str, Any] = {"description": reply.description}
        headers = [REQUEST_ID, *reply.headers]
        answer["headers"] = {h.name: components.header(h) for h in headers}
        body = _schema(reply)
        if body is not None:
            answer["content"] = {reply.media_type: {"schema": body}}
        if reply.links:
            answer["links"] = {link.name: _link(link) for link in reply.links}
        responses[str(reply.status)] = answer
    by_status: dict[int, list[type[GatewayError]]] = {}
    for cls in operation_errors(endpoint):
        by_status.setdefault(status_of(cls), []).append(cls)
    for status, classes in by_status.items():
        if str(status) in responses:
            raise ValueError(f"{doc.operation_id} answers {status} both as a reply and an error")
        responses[str(status)] = _error_response(status, classes, components)
    out["responses"] = dict(sorted(responses.items()))
    return out


def _error_response(
    status: int, classes: Sequence[type[GatewayError]], components: Components
) -> dict[str, str]:
    """A reference to the error answer for these classes, named after their codes
    (`LeaseLost`, `DrainingOrStoreUnavailable`), which every operation answering the
    same codes shares."""
    classes = sorted(classes, key=lambda cls: cls.code)
    name = "Or".join(cls.code.title().replace("_", "") for cls in classes)
    headers = [REQUEST_ID]
    for cls in classes:
        for header in _error_headers(cls):
            headers.append(ERROR_HEADERS.get(header, Param(header, "", {"type": "string"}, True)))
    entry = {
        "description": _problem_text(classes),
        "headers": {h.name: components.header(h) for h in headers},
        "content": {PROBLEM_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        PROBLEM_CODES: [cls.code for cls in classes],
    }
    if components.responses.setdefault(name, entry) != entry:
        raise ValueError(f"two different error answers are named {name}")
    return {"$ref": f"#/components/responses/{name}"}


def _share_parameters(paths: Mapping[str, Any], shared: dict[str, Any]) -> None:
    """Moves each parameter that several operations declare alike to `shared`, named
    after it, and refers to it there."""
    operations = [op for item in paths.values() for op in item.values()]

    def key(param: Mapping[str, Any]) -> str:
        return json.dumps(param, sort_keys=True)

    uses = Counter(key(p) for op in operations for p in op.get("parameters", []))
    names: dict[str, str] = {}
    for op in operations:
        for i, param in enumerate(op.get("parameters", [])):
            if uses[key(param)] < 2:
                continue
            name = names.setdefault(key(param), param["name"])
            if shared.setdefault(name, param) != param:
                continue  # another parameter of this name is shared: this one stays
            op["parameters"][i] = {"$ref": f"#/components/parameters/{name}"}


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


def _link(link: Link) -> dict[str, Any]:
    out: dict[str, Any] = {"operationId": link.operation_id, "parameters": dict(link.parameters)}
    if link.request_body is not None:
        out["requestBody"] = dict(link.request_body)
    return out


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
    # Open to codes a later release adds: a client generated from this document parses
    # them as plain strings rather than failing on a value its enum lacks.
    properties["code"] = {
        "anyOf": [{"$ref": "#/components/schemas/ProblemCode"}, {"type": "string"}],
        "description": "One of ProblemCode's values; a later release may add more.",
    }
    schema["properties"] = properties
    return schema
