"""The documentation site's generated references: the HTTP API and the configuration.

A mkdocs hook (mkdocs.yml, `hooks:`). At every build it writes two pages from the code
itself, so that neither can drift from what the gateway does and neither is committed:

- reference/api.md, from the OpenAPI document the app serves at /openapi.json, built
  in-process by the same call (gateway.http.openapi.build over the endpoint table) with
  the default settings' limits;
- reference/configuration.md, from the environment variables' declarations
  (gateway.environment.GROUPS), the only names Settings.from_env reads;

and it adds bench/last-run.png, the figure of the performance page.

tests/unit/test_settings_docs.py renders the configuration page with this module too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from gateway.environment import GROUPS, Variable
from gateway.http import openapi
from gateway.http.routes import ENDPOINTS
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
API_PAGE = "reference/api.md"
CONFIGURATION_PAGE = "reference/configuration.md"
# The figure of the bench's last run, shown by the performance page (which includes
# bench/README.md, where it sits beside the text).
BENCH_FIGURE = ("performance/last-run.png", ROOT / "bench" / "last-run.png")
# The order in which the API's tags are shown, with what each groups; a tag missing here
# is shown after these, under its own name.
TAGS = {
    "producers": "Producers: enqueue tasks and follow them",
    "daemons": "Daemons: claim tasks and report on them",
    "controls": "Controls: pause and limit a runtime",
    "admin": "Admin: tokens and webhook secrets",
    "operations": "Operations: health, readiness, metrics and this document",
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """mkdocs event: add the two generated pages, and the bench's figure, to the site."""
    files.append(File.generated(config, API_PAGE, content=api_page(api_document())))
    files.append(File.generated(config, CONFIGURATION_PAGE, content=configuration_page()))
    uri, path = BENCH_FIGURE
    files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def api_document() -> dict[str, Any]:
    """The document GET /openapi.json answers on a gateway with the default settings."""
    return openapi.build(ENDPOINTS, Settings())


# -- the HTTP API ----------------------------------------------------------------------


def api_page(doc: Mapping[str, Any]) -> str:
    """The OpenAPI document as Markdown: operations grouped by tag, each with its method,
    path, summary, description, parameters, request body and responses."""
    schemas = doc["components"]["schemas"]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            by_tag.setdefault(operation["tags"][0], []).append((method.upper(), path, operation))
    out = [
        "# HTTP API reference",
        "",
        "Generated from the OpenAPI document the gateway serves at `GET /openapi.json` "
        f"(OpenAPI {doc['openapi']}, version {doc['info']['version']}), with the limits of "
        "the default configuration: a deployment that changes `GATEWAY_MAX_WAIT_SECONDS`, "
        "`GATEWAY_DEFAULT_LEASE_SECONDS`, `GATEWAY_MAX_PAYLOAD_BYTES` or "
        "`GATEWAY_MAX_JSON_DEPTH` serves its own figures. The rules every call shares "
        "(errors, times, numbers, tokens) are in [Conventions](../api/overview.md).",
        "",
        doc["info"]["description"],
        "",
    ]
    order = [*TAGS, *sorted(set(by_tag) - set(TAGS))]
    for tag in (t for t in order if t in by_tag):
        out += [f"## {TAGS.get(tag, tag)}", ""]
        for method, path, operation in by_tag[tag]:
            out += _operation(method, path, operation, doc)
    out += ["## Schemas", "", "The bodies named above, field by field.", ""]
    for name in sorted(schemas):
        out += _schema_section(name, schemas[name])
    return "\n".join(out) + "\n"


def _anchor(name: str) -> str:
    return "schema-" + name.lower()


def _schema_section(name: str, schema: Mapping[str, Any]) -> list[str]:
    out = [f"### {name} {{#{_anchor(name)}}}", ""]
    if schema.get("description"):
        out += [_cell(schema["description"]), ""]
    rows = _field_rows(schema)
    if rows:
        out += rows
    elif not schema.get("description"):
        out += [f"Value: {_value(schema)}.", ""]
    return out


def _field_rows(schema: Mapping[str, Any]) -> list[str]:
    """A table of an object's fields; an array's items that are objects of their own are
    shown as `field[].name` rows under it."""
    properties = schema.get("properties", {})
    if not properties:
        return []
    out = ["| field | required | value | meaning |", "|---|---|---|---|"]
    out += _rows("", schema)
    return [*out, ""]


def _rows(prefix: str, schema: Mapping[str, Any]) -> list[str]:
    needed = set(schema.get("required", []))
    out = []
    for field, spec in schema.get("properties", {}).items():
        out.append(
            f"| `{prefix}{field}` | {'yes' if field in needed else 'no'} | {_value(spec)} "
            f"| {_cell(spec.get('description', ''))} |"
        )
        items = spec.get("items", {})
        if spec.get("type") == "array" and "properties" in items and not prefix:
            out += _rows(f"{prefix}{field}[].", items)
    return out


def _component(node: Mapping[str, Any], doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """A parameter, response, header or request body that is a `$ref` into components,
    resolved (schemas stay references: the page links to them)."""
    while "$ref" in node and not node["$ref"].startswith("#/components/schemas/"):
        _, _, kind, name = node["$ref"].split("/")
        node = doc["components"][kind][name]
    return node


def _operation(
    method: str, path: str, operation: Mapping[str, Any], doc: Mapping[str, Any]
) -> list[str]:
    schemas = doc["components"]["schemas"]
    out = [
        f"### {operation['summary']}",
        "",
        f"`{method} {path}` (operation `{operation['operationId']}`)",
        "",
        operation["description"],
        "",
    ]
    parameters = operation.get("parameters", [])
    if parameters:
        out += ["**Parameters**", "", "| name | in | required | value | meaning |"]
        out += ["|---|---|---|---|---|"]
        for p in (_component(p, doc) for p in parameters):
            required = "yes" if p.get("required") else "no"
            out.append(
                f"| `{p['name']}` | {p['in']} | {required} | {_value(p.get('schema', {}))} "
                f"| {_cell(p.get('description', ''))} |"
            )
        out.append("")
    body = operation.get("requestBody")
    if body is not None:
        out += _request_body(_component(body, doc), schemas)
    out += ["**Responses**", "", "| status | meaning | body |", "|---|---|---|"]
    for status, reference in operation["responses"].items():
        response = _component(reference, doc)
        media = ", ".join(
            f"`{kind}` {_schema_name(content.get('schema', {}))}".rstrip()
            for kind, content in response.get("content", {}).items()
        )
        codes = response.get("x-problem-codes", [])
        if codes:
            media += " (`code`: " + ", ".join(f"`{c}`" for c in codes) + ")"
        headers = [h for h in response.get("headers", {}) if h != "X-Request-ID"]
        if headers:
            media += "; headers " + ", ".join(f"`{h}`" for h in headers)
        out.append(f"| {status} | {_cell(response['description'])} | {media or '(none)'} |")
    out.append("")
    return out


def _request_body(body: Mapping[str, Any], schemas: Mapping[str, Any]) -> list[str]:
    (kind, content), *_ = body["content"].items()
    name = _schema_name(content["schema"])
    schema = _resolve(content["schema"], schemas)
    required = "required" if body.get("required") else "optional"
    out = [f"**Request body** ({required}, `{kind}`): {name}", ""]
    if schema.get("description"):
        out += [schema["description"], ""]
    out += _field_rows(schema)
    return out


def _resolve(schema: Mapping[str, Any], schemas: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref", "")
    return schemas[ref.rsplit("/", 1)[1]] if ref else schema


def _schema_name(schema: Mapping[str, Any]) -> str:
    """The named schema(s) a body is: `Task`, `TaskList` or `TaskRefList`, array of `X`."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[`{name}`](#{_anchor(name)})"
    for key, joint in (("allOf", " "), ("oneOf", " or "), ("anyOf", " or ")):
        names = [_schema_name(s) for s in schema.get(key, [])]
        if any(names):
            return joint.join(n for n in names if n)
    if schema.get("type") == "array":
        inner = _schema_name(schema.get("items", {}))
        return f"array of {inner}" if inner else ""
    return ""


def _value(schema: Mapping[str, Any]) -> str:
    """A field's type and bounds, in words: `integer, 1 to 100, default 1`."""
    if "$ref" in schema or "allOf" in schema:
        return _schema_name(schema) or "object"
    enum = schema.get("enum", [])
    word = "string" if enum and all(isinstance(v, str) for v in enum) else "any JSON value"
    kinds = schema.get("type", word)
    if isinstance(kinds, list):
        kinds = " or ".join(k for k in kinds if k != "null") + (
            " (or null)" if "null" in kinds else ""
        )
    parts = [_cell(str(kinds))]
    if _schema_name(schema.get("items", {})):
        parts.append(f"of {_schema_name(schema['items'])}")
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"]))
    if "format" in schema:
        parts.append(str(schema["format"]))
    parts += _bounds(schema.get("minimum"), schema.get("maximum"), "")
    parts += _bounds(schema.get("minLength"), schema.get("maxLength"), " characters")
    parts += _bounds(schema.get("minItems"), schema.get("maxItems"), " items")
    if "default" in schema:
        parts.append(f"default `{json.dumps(schema['default'])}`")
    return ", ".join(parts)


def _bounds(low: Any, high: Any, unit: str) -> list[str]:
    if low is not None and high is not None:
        return [f"{_number(low)} to {_number(high)}{unit}"]
    if high is not None:
        return [f"at most {_number(high)}{unit}"]
    if low is not None:
        return [f"at least {_number(low)}{unit}"]
    return []


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else str(value)


def _cell(text: str) -> str:
    """Text that stays in one table cell: no line breaks, no bare column bars."""
    return " ".join(text.split()).replace("|", "\\|")


# -- the configuration -----------------------------------------------------------------


def configuration_page(groups: Iterable[tuple[str, Iterable[Variable]]] = GROUPS) -> str:
    """Every environment variable the gateway reads, by concern: a table of each group's
    variables, then one section each."""
    out = [
        "# Configuration reference",
        "",
        "The gateway reads its configuration from the environment, once, at start-up, "
        "and checks it there: a bad value stops the process with a message naming the "
        "variable. Secrets are never logged. An unset or empty variable takes its default. "
        "A switch reads `on` or `off` (also `true`/`false`, `1`/`0`, `yes`/`no`).",
        "",
        "This page is generated from the declarations in `gateway/environment/`, the "
        "only names `gateway serve` reads.",
        "",
    ]
    for title, variables in groups:
        variables = list(variables)
        out += [f"## {title}", "", "| variable | default | values |", "|---|---|---|"]
        for v in variables:
            anchor = v.name.lower().replace("_", "-")
            out.append(f"| [`{v.name}`](#{anchor}) | {shown_default(v)} | {allowed(v)} |")
        out.append("")
        for v in variables:
            anchor = v.name.lower().replace("_", "-")
            out += [f"### `{v.name}` {{#{anchor}}}", ""]
            out += [f"Default: {shown_default(v)}. Values: {allowed(v)}.", ""]
            out += [_site_links(v.doc), ""]
    return "\n".join(out)


def _site_links(text: str) -> str:
    """A declaration links to pages by their path from the site's root; this page sits
    one folder down."""
    return re.sub(r"\]\((?![a-z]+:|#|/)", "](../", text)


def shown_default(v: Variable) -> str:
    """The default as the reference shows it."""
    if v.shown_default:
        return v.shown_default
    if v.default is None:
        return "(unset)"
    if isinstance(v.default, bool):
        return "`on`" if v.default else "`off`"
    if isinstance(v.default, float):
        return f"`{_plain(v.default)}`"
    return f"`{v.default}`"


def allowed(v: Variable) -> str:
    """The values a variable accepts, with its unit."""
    if v.choices:
        return ", ".join(f"`{c}`" for c in v.choices)
    if v.low is not None and v.high is not None:
        whole = "whole " if v.kind == "integer" else ""
        unit = f" {v.unit}" if v.unit else ""
        return f"{whole}{_plain(v.low)} to {_plain(v.high)}{unit}"
    return "a URL" if v.name.endswith("_URL") else "text"


def _plain(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
