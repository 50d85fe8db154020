"""What a field's value becomes: times within the bounds a request may carry, and JSON
text for storage, depth- and size-checked, spent from the request's WrittenBudget; and
how an item's error names the item."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, TypeVar

from ..errors import GatewayError, PayloadTooLarge, RequestTooLarge, ValidationFailed
from . import exactjson

E = TypeVar("E", bound=GatewayError)
# orjson writes NUL as \u0000; an escaped backslash before "u0000" is not a NUL.
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Times a request may carry: well inside what both Python and Postgres can store.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


# An RFC 3339 time with a zone, as a TIME field reads it and the document says it (the
# `date-time` format alone only annotates: an empty string would be valid).
TIME_RE = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)


def parse_time(field: str, raw: Any) -> datetime:
    if not isinstance(raw, str):
        raise ValidationFailed(f"{field} must be an RFC 3339 time string", field=field)
    try:
        if not TIME_RE.fullmatch(raw):
            raise ValueError(raw)
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValidationFailed(
            f"{field} must be an RFC 3339 time such as 2026-11-25T21:02:03Z", field=field
        ) from None
    if value.tzinfo is None:
        raise ValidationFailed(f"{field} must carry a time zone (Z or +hh:mm)", field=field)
    if not EARLIEST <= value <= LATEST:
        raise ValidationFailed(
            f"{field} must lie between {EARLIEST.year} and {LATEST.year}", field=field
        )
    return value


def too_deep(field: str, max_depth: int) -> ValidationFailed:
    """The refusal of a JSON field nested deeper than `max_depth`."""
    return ValidationFailed(
        f"{field} is nested more than {max_depth} levels deep (GATEWAY_MAX_JSON_DEPTH)",
        field=field,
    )


def check_depth(field: str, value: Any, max_depth: int) -> None:
    if exactjson.depth(value, max_depth) > max_depth:
        raise too_deep(field, max_depth)


def in_item(error: E, index: int, array: str = "tasks") -> E:
    """`error`, raised by an item of a list field, made to name the item:
    `tasks[3]: ...`, field `tasks[3].lease_id`, index 3."""
    if isinstance(error, RequestTooLarge):
        return error
    inner = error.extra.get("field")
    error.detail = f"{array}[{index}]: {error.detail}"
    error.extra.update(field=f"{array}[{index}].{inner}" if inner else f"{array}[{index}]")
    error.extra.update(index=index)
    return error


class WrittenBudget:
    """What the JSON values one request stores (payloads, results) may come to
    together, written out as Postgres writes them and answers then carry them
    (GATEWAY_MAX_BODY_BYTES): numbers written short, such as 1e4299, must not turn a
    small request into a huge answer. One per request; json_text spends from it."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def spend(self, written: int) -> None:
        """Counts one value's written size; RequestTooLarge naming `body` past the limit."""
        self.left -= written
        if self.left < 0:
            raise RequestTooLarge(
                f"the request's JSON values come to more than {self.limit} bytes written "
                "out in full, as answers carry them (1e300 is 301 digits); the limit is "
                "GATEWAY_MAX_BODY_BYTES",
                field="body",
            )


# The key under which a parser's limits carry the request's WrittenBudget, if any.
WRITTEN_BUDGET = "written_budget"


def json_text(
    field: str, value: Any, max_bytes: int, max_depth: int, budget: WrittenBudget | None = None
) -> str:
    """A JSON value serialized for storage, depth- and size-checked, numbers exact,
    its written size spent from the request's `budget`. Postgres jsonb cannot hold the
    NUL character, so it is refused here rather than failing in the database."""
    try:
        raw = exactjson.dumps(value)
    except ValueError as exc:
        check_depth(field, value, max_depth)  # too deep to write is refused as too deep
        raise ValidationFailed(f"{field}: {exc}", field=field) from None
    # Each level of nesting takes two characters at least (`[]`): a shorter text
    # cannot be too deep, and is not walked.
    if len(raw) > 2 * max_depth:
        check_depth(field, value, max_depth)
    text = raw.decode()
    # Counted as it will be answered: Postgres writes 1e300 out as 301 digits.
    written = len(raw) + exactjson.expansion(text, value)
    if written > max_bytes:
        raise PayloadTooLarge(
            f"{field} is larger than {max_bytes} bytes serialized (numbers written out)",
            field=field,
        )
    if budget is not None:
        budget.spend(written)
    # The substring test first: the pattern costs more than the rest of this function.
    if "\\u0000" in text and NUL_ESCAPE.search(text):
        raise ValidationFailed(f"{field} must not contain NUL characters (\\u0000)", field=field)
    return text
