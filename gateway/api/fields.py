"""Request fields, declared once. A `Field` says what one body field is (JSON type,
bounds, default, meaning); the parsers (requests.py) read bodies through these specs,
and the OpenAPI document describes them from the same objects, so validation and
documentation cannot drift apart.

Bounds that depend on the deployment are `Setting`s, filled in from `limits` (setting
name -> value) when a body is read or documented.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import ValidationFailed
from . import exactjson, trace
from .values import TIME_RE, WRITTEN_BUDGET, json_text, parse_time

Limits = Mapping[str, Any]


class Kind(enum.Enum):
    """How a field is read. Unless a kind says otherwise, null is the same as absent."""

    INTEGER = "integer"  # a whole number in [minimum, maximum]
    NUMBER = "number"  # any number in [minimum, maximum]
    BOOLEAN = "boolean"  # true or false; null is refused
    STRING = "string"  # non-empty, at most max_length characters, no NUL
    TEXT = "text"  # any string, taken as sent
    UUID = "uuid"  # a STRING that is a UUID; `hint` says which one
    TIME = "time"  # an RFC 3339 time with a zone, between EARLIEST and LATEST
    JSON = "json"  # any JSON value, stored: depth- and size-checked; a required one may be null
    ARRAY = "array"  # a list of min_items to max_items `items` objects, read by the caller
    TRACE = "trace"  # a W3C trace context object; malformed reads as absent, never refused

    # A member is its own key: Enum's __hash__ hashes the name in Python code, and every
    # field read looks its reader up by kind.
    __hash__ = object.__hash__


@dataclass(frozen=True)
class Setting:
    """A bound taken from the gateway's settings: the name of a Settings attribute."""

    name: str

    @property
    def variable(self) -> str:
        return "GATEWAY_" + self.name.upper()


Bound = int | float | Setting


def resolve(value: Any, limits: Limits) -> Any:
    return limits[value.name] if isinstance(value, Setting) else value


@dataclass(frozen=True)
class Field:
    """One body (or query, or header) field: the single place its rules are written."""

    name: str
    kind: Kind
    description: str
    required: bool = False
    default: Any = None  # a value, or a Setting
    minimum: Bound | None = None
    maximum: Bound | None = None
    max_length: int | None = None  # STRING, UUID
    max_bytes: Bound | None = None  # JSON: serialized size
    max_depth: Bound | None = None  # JSON: nesting
    min_items: int = 0  # ARRAY
    max_items: int | None = None  # ARRAY
    items: Body | None = None  # ARRAY
    enum: tuple[str, ...] = ()  # documented; the reader of a query checks it
    enum_name: str = ""  # the enum's schema in the document's components, if it has one
    hint: str = ""  # what a valid value is, in words, for error messages
    # Documented as this kind instead, with no enum: for a query field whose reader takes
    # more spellings than the kind's schema names (`1` and `0` beside `true` and `false`).
    documented_as: Kind | None = None

    def settings(self) -> Iterator[str]:
        """Names of the settings this field's rules depend on."""
        for value in (self.default, self.minimum, self.maximum, self.max_bytes, self.max_depth):
            if isinstance(value, Setting):
                yield value.name
        if self.items is not None:
            yield from self.items.settings()

    def read(self, body: Mapping[str, Any], limits: Limits) -> Any:
        """The field's value from a decoded body, or ValidationFailed naming it."""
        return _READERS[self.kind](self, body, limits)

    @property
    def null_means_absent(self) -> bool:
        """True when null reads as leaving the field out, and so does a missing key."""
        return not self.required and self.kind in _NULL_MEANS_ABSENT

    def fail(self, message: str) -> ValidationFailed:
        return ValidationFailed(message, field=self.name)

    def json_schema(self, limits: Limits, nullable: bool = True) -> dict[str, Any]:
        """The field as JSON Schema (2020-12, as OpenAPI 3.1 uses it). `nullable`:
        document that null is the same as leaving an optional field out (bodies).

        A default is written in the description, never as `default`: client generators
        make a field with a `default` required (TypeScript) or send the default on every
        request (Python), and a default from settings is this server's alone."""
        kind = self.documented_as or self.kind
        out: dict[str, Any] = _SCHEMAS[kind](self, limits)
        if self.enum_name:
            out = {"$ref": f"#/components/schemas/{self.enum_name}"}
            if nullable and self.null_means_absent:
                out = {"anyOf": [out, {"type": "null"}]}
        elif self.enum and self.documented_as is None:
            out["enum"] = list(self.enum)
        if nullable and not self.required and self.kind in _NULL_MEANS_ABSENT and "type" in out:
            out["type"] = [out["type"], "null"]
        out["description"] = self.description + _limits_text(self, limits)
        return out


@dataclass(frozen=True)
class Body:
    """A JSON object body (or a set of query parameters) made of fields."""

    name: str  # its schema's name in the document
    description: str
    fields: tuple[Field, ...]
    exclusive: tuple[tuple[str, str], ...] = ()  # pairs that may not both be given
    one_of: tuple[str, ...] = ()  # fields of which one at least must be given, not null
    closed: bool = False  # a field it does not declare is refused
    min_fields: int = 0  # fields that must be given at least
    example: Mapping[str, Any] | None = None  # a body the server accepts, for readers

    def __getitem__(self, name: str) -> Field:
        for field in self.fields:
            if field.name == name:
                return field
        raise KeyError(name)

    @property
    def required(self) -> bool:
        """Whether a request must carry the body: a field or min_fields say so."""
        return self.min_fields > 0 or any(f.required for f in self.fields)

    def settings(self) -> Iterator[str]:
        for field in self.fields:
            yield from field.settings()

    def check_fields(self, body: Any) -> None:
        """For a closed body: an object of its fields only, at least min_fields of them;
        else ValidationFailed naming what is wrong."""
        if not isinstance(body, dict):
            raise ValidationFailed("the body must be a JSON object", field="body")
        names = [f.name for f in self.fields]
        unknown = sorted(set(body) - set(names))
        if self.closed and unknown:
            raise ValidationFailed(
                f"unknown field {unknown[0]!r}; the fields are {', '.join(names)}",
                field=unknown[0],
            )
        if len(body) < self.min_fields:
            raise ValidationFailed(f"give at least one of {', '.join(names)}", field="body")

    def check_exclusive(self, body: Mapping[str, Any]) -> None:
        for first, second in self.exclusive:
            if body.get(first) is not None and body.get(second) is not None:
                raise ValidationFailed(f"give {first} or {second}, not both", field=second)

    def components(self, limits: Limits) -> dict[str, dict[str, Any]]:
        """This body's schema by its name, and those of the bodies its arrays hold."""
        out = {self.name: self.json_schema(limits)}
        for field in self.fields:
            if field.items is not None:
                out.update(field.items.components(limits))
        return out

    def json_schema(self, limits: Limits) -> dict[str, Any]:
        """The body's schema; an array's items refer to their own (see components)."""
        out: dict[str, Any] = {
            "type": "object",
            "description": self.description,
            "properties": {f.name: f.json_schema(limits) for f in self.fields},
        }
        required = [f.name for f in self.fields if f.required]
        if required:
            out["required"] = required
        if self.closed:
            out["additionalProperties"] = False
        if self.min_fields:
            out["minProperties"] = self.min_fields
        given = {"not": {"type": "null"}}
        rules = [
            {"not": {"required": [first, second], "properties": {first: given, second: given}}}
            for first, second in self.exclusive
        ]
        if self.one_of:
            one_of: dict[str, Any] = {
                "anyOf": [{"required": [f], "properties": {f: given}} for f in self.one_of]
            }
            rules.append(one_of)
        # One rule stands alone, where generators ignore it; several go in an allOf.
        if len(rules) == 1:
            out.update(rules[0])
        elif rules:
            out["allOf"] = rules
        if self.example is not None:
            out["examples"] = [dict(self.example)]
        return out


@dataclass(frozen=True)
class RawBody:
    """A body documented by a JSON Schema given as is, for a body a handler reads
    itself: a webhook's payload, which may be any JSON."""

    name: str
    description: str
    schema: Mapping[str, Any]
    required: bool = True

    def settings(self) -> Iterator[str]:
        return iter(())

    def components(self, limits: Limits) -> dict[str, dict[str, Any]]:
        return {self.name: self.json_schema(limits)}

    def json_schema(self, limits: Limits) -> dict[str, Any]:
        return {**self.schema, "description": self.description}


# -- reading ------------------------------------------------------------------


def _integer(f: Field, body: Mapping[str, Any], limits: Limits) -> int | None:
    low, high = resolve(f.minimum, limits), resolve(f.maximum, limits)
    raw = body.get(f.name)
    if raw is None:
        if f.required:
            raise f.fail(f"{f.name} is required")
        raw = resolve(f.default, limits)
        if raw is None:
            return None
    if isinstance(raw, exactjson.ExactNumber):  # beyond 64 bits, or not a whole number
        raise f.fail(f"{f.name} must be an integer from {low} to {high}")
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != int(raw):
        raise f.fail(f"{f.name} must be an integer")
    if not low <= raw <= high:
        raise f.fail(f"{f.name} must be between {low} and {high}")
    return int(raw)


def _number(f: Field, body: Mapping[str, Any], limits: Limits) -> float | None:
    low, high = resolve(f.minimum, limits), resolve(f.maximum, limits)
    raw = body.get(f.name)
    if raw is None:
        default = resolve(f.default, limits)
        return None if default is None else float(default)
    if isinstance(raw, exactjson.ExactNumber):
        raw = float(raw)  # a duration need not be exact; inf is refused as out of range
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise f.fail(f"{f.name} must be a number")
    if not low <= raw <= high:
        raise f.fail(f"{f.name} must be between {low:g} and {high:g}")
    return float(raw)


def _boolean(f: Field, body: Mapping[str, Any], limits: Limits) -> bool:
    raw = body.get(f.name, resolve(f.default, limits))
    if not isinstance(raw, bool):
        raise f.fail(f"{f.name} must be true or false")
    return raw


def _string(f: Field, body: Mapping[str, Any], limits: Limits) -> str | None:
    raw = body.get(f.name)
    if raw is None:
        if f.required:
            raise f.fail(f"{f.name} is required")
        return None
    if not isinstance(raw, str) or not raw:
        raise f.fail(f"{f.name} must be a non-empty string")
    if f.max_length is not None and len(raw) > f.max_length:
        raise f.fail(f"{f.name} must be at most {f.max_length} characters")
    if "\x00" in raw:
        raise f.fail(f"{f.name} must not contain NUL characters")
    return raw


def _text(f: Field, body: Mapping[str, Any], limits: Limits) -> str | None:
    raw = body.get(f.name)
    if raw is None and not f.required:
        return None
    if not isinstance(raw, str):
        raise f.fail(f"{f.name} is required: {f.hint}")
    return raw


def _uuid(f: Field, body: Mapping[str, Any], limits: Limits) -> uuid.UUID | None:
    raw = _string(f, body, limits)
    if raw is None:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise f.fail(f"{f.name} must be {f.hint}") from None


def _time(f: Field, body: Mapping[str, Any], limits: Limits) -> datetime | None:
    raw = body.get(f.name)
    if raw is None:
        if f.required:
            raise f.fail(f"{f.name} is required")
        return None
    return parse_time(f.name, raw)


def _json(f: Field, body: Mapping[str, Any], limits: Limits) -> str | None:
    if f.required and f.name not in body:
        raise f.fail(f"{f.name} is required ({f.hint})")
    if not f.required and body.get(f.name) is None:
        return None
    max_bytes, max_depth = resolve(f.max_bytes, limits), resolve(f.max_depth, limits)
    return json_text(f.name, body[f.name], max_bytes, max_depth, limits.get(WRITTEN_BUDGET))


def _array(f: Field, body: Mapping[str, Any], limits: Limits) -> list[Any]:
    raw = body.get(f.name)
    if not isinstance(raw, list) or not f.min_items <= len(raw) <= (f.max_items or len(raw)):
        raise f.fail(f"{f.name} must be a list of {f.min_items} to {f.max_items} {f.hint}")
    return raw


def _trace(f: Field, body: Mapping[str, Any], limits: Limits) -> trace.TraceContext | None:
    return trace.from_item(body.get(f.name))


_READERS = {
    Kind.INTEGER: _integer,
    Kind.NUMBER: _number,
    Kind.BOOLEAN: _boolean,
    Kind.STRING: _string,
    Kind.TEXT: _text,
    Kind.UUID: _uuid,
    Kind.TIME: _time,
    Kind.JSON: _json,
    Kind.ARRAY: _array,
    Kind.TRACE: _trace,
}


# -- reading a query string -----------------------------------------------------

# A query value read as a number: what a JSON number may be, leading zeros allowed.
_QUERY_NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$")
# More digits than any bound a query field has: not read by int() (which refuses over
# 4300 digits with an error of its own).
_QUERY_DIGITS = 20


def read_query(field: Field, params: Mapping[str, str], limits: Limits) -> Any:
    """A query parameter read by its field's rules, as a body field is read: absent,
    its default; present, even empty, a value of its kind, so that `?limit=` or
    `?cursor=` is a 422 naming the parameter, as the document's schema says, and not
    the same as leaving it out."""
    raw = params.get(field.name)
    if raw is None:
        return field.read({}, limits)
    if field.enum and raw not in field.enum:
        raise field.fail(f"{field.name} must be one of {', '.join(field.enum)}")
    return field.read({field.name: query_value(field, raw)}, limits)


def query_value(field: Field, raw: str) -> Any:
    """A query string's text as the JSON value its field reads: a number for an
    INTEGER or NUMBER field, else the text itself."""
    if field.kind is Kind.INTEGER:
        digits = raw.removeprefix("-").lstrip("0") or "0"
        if not (digits.isascii() and digits.isdigit()):
            raise field.fail(f"{field.name} must be an integer")
        # Beyond every bound: the reader refuses it as out of range.
        value = int(digits) if len(digits) <= _QUERY_DIGITS else 10**_QUERY_DIGITS
        return -value if raw.startswith("-") else value
    if field.kind is Kind.NUMBER:
        if not _QUERY_NUMBER.fullmatch(raw):
            raise field.fail(f"{field.name} must be a number")
        return float(raw)  # beyond a float's range: inf, refused as out of range
    return raw


# -- documenting --------------------------------------------------------------

# What a JSON field may hold, in the document's components: any JSON value but one with
# the NUL character in a string or a key, which json_text refuses (Postgres cannot
# store it).
JSON_VALUE = "JsonValue"
_NO_NUL = "^[^\\u0000]*$"
_JSON_VALUE_REF = {"$ref": f"#/components/schemas/{JSON_VALUE}"}
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "description": "Any JSON value without the NUL character (\\u0000) in a string or a key.",
    "pattern": _NO_NUL,
    "propertyNames": {"pattern": _NO_NUL},
    # The same rule for what an object or an array holds, behind if/then, which client
    # generators skip: to them this is any value (a bare `additionalProperties` makes
    # it an object to a TypeScript generator, and a list of types defeats a Python one).
    "if": {"type": "object"},
    "then": {"additionalProperties": _JSON_VALUE_REF},
    "else": {"if": {"type": "array"}, "then": {"items": _JSON_VALUE_REF}},
}


def _bounded(json_type: str, f: Field, limits: Limits) -> dict[str, Any]:
    out: dict[str, Any] = {"type": json_type}
    if f.minimum is not None:
        out["minimum"] = resolve(f.minimum, limits)
    if f.maximum is not None:
        out["maximum"] = resolve(f.maximum, limits)
    return out


def _string_schema(f: Field, limits: Limits) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string", "minLength": 1, "pattern": _NO_NUL}
    if f.max_length is not None:
        out["maxLength"] = f.max_length
    return out


def _limits_text(f: Field, limits: Limits) -> str:
    """The settings behind a field's bounds, and the limits JSON Schema cannot say."""
    text = ""
    default = resolve(f.default, limits)
    if isinstance(f.default, Setting):
        text += (
            f" Left out: the server's default, {_json_text(default)} here "
            f"({f.default.variable}, which another server may set otherwise)."
        )
    elif default is not None:
        text += f" Left out: {_json_text(default)}."
    if isinstance(f.maximum, Setting):
        text += f" The maximum is set by {f.maximum.variable}."
    if f.max_bytes is not None:
        text += f" At most {resolve(f.max_bytes, limits)} bytes serialized"
        if isinstance(f.max_bytes, Setting):
            text += f" ({f.max_bytes.variable})"
        text += "."
    if f.max_depth is not None:
        text += f" Nested at most {resolve(f.max_depth, limits)} levels deep"
        if isinstance(f.max_depth, Setting):
            text += f" ({f.max_depth.variable})"
        text += "."
    return text


def _json_text(value: Any) -> str:
    """A default as JSON writes it: `true`, `50`, `0.5`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _array_schema(f: Field, limits: Limits) -> dict[str, Any]:
    """The items are a body of their own, named in the document's components."""
    assert f.items is not None
    out: dict[str, Any] = {
        "type": "array",
        "items": {"$ref": f"#/components/schemas/{f.items.name}"},
    }
    out["minItems"] = f.min_items
    if f.max_items is not None:
        out["maxItems"] = f.max_items
    return out


# Kinds whose optional fields take null as "not given" (a JSON field's null is a value).
_NULL_MEANS_ABSENT = (Kind.INTEGER, Kind.NUMBER, Kind.STRING, Kind.TEXT, Kind.UUID, Kind.TIME)

_SCHEMAS: dict[Kind, Any] = {
    Kind.INTEGER: lambda f, limits: _bounded("integer", f, limits),
    Kind.NUMBER: lambda f, limits: _bounded("number", f, limits),
    Kind.BOOLEAN: lambda f, limits: {"type": "boolean"},
    Kind.STRING: _string_schema,
    Kind.TEXT: lambda f, limits: {"type": "string"},
    Kind.UUID: lambda f, limits: {"type": "string", "format": "uuid"},
    Kind.TIME: lambda f, limits: {
        "type": "string",
        "format": "date-time",
        "pattern": TIME_RE.pattern,
    },
    Kind.JSON: lambda f, limits: {"$ref": f"#/components/schemas/{JSON_VALUE}"},
    Kind.ARRAY: _array_schema,
    Kind.TRACE: lambda f, limits: dict(trace.REQUEST_SCHEMA),
}
