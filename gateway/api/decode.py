"""Decoding what arrives before a parser reads it: a body as JSON (numbers exact, depth
bounded), the ids in a path, a header's text."""

from __future__ import annotations

import re
import uuid
from typing import Any

from ..errors import BadRequest, NotFound, ValidationFailed
from . import exactjson
from .bodies import BATCH_BODY, CLAIM_BODY
from .values import in_item, too_deep

RUNTIME_ID_MAX_CHARS = 128
RUNTIME_ID_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._:-]{{0,{RUNTIME_ID_MAX_CHARS - 1}}}$")
DEFAULT_MAX_DEPTH = 64  # GATEWAY_MAX_JSON_DEPTH
# Levels a body may add around a payload: {"tasks": [{"payload": ...}]}.
BODY_DEPTH_MARGIN = 3
# The lists of items a body may hold: every batch body's (bodies.BATCH_BODY,
# COMPLETE_MANY_BODY ...), and the acknowledgements a claim carries.
_ITEM_LISTS = (BATCH_BODY["tasks"].name, CLAIM_BODY["complete"].name, CLAIM_BODY["fail"].name)


def check_runtime_id(runtime_id: str) -> str:
    if not RUNTIME_ID_RE.fullmatch(runtime_id):
        raise ValidationFailed(
            "runtime id must be 1-128 characters of letters, digits and . _ : -, "
            "starting with a letter or digit",
            field="runtime_id",
        )
    return runtime_id


def check_task_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"no task with id {raw!r}") from None


def decode_body(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> dict[str, Any]:
    """The request body as a JSON object; an empty body counts as {}, but one of
    whitespace alone is no JSON text and is refused like any other (400). Numbers are
    kept exactly (see exactjson); the fields that store JSON (payload, result) are
    held to `max_depth`, and to the request's WrittenBudget, when they are read."""
    if not raw:
        return {}
    try:
        body = exactjson.loads(raw, max_depth + BODY_DEPTH_MARGIN)
    except exactjson.NestedTooDeep as exc:
        raise _nested_too_deep(exc.value, max_depth, "body") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def decode_json(raw: bytes, field: str, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """A whole body that is one JSON value, the `field` it becomes (a webhook's
    payload), numbers kept exactly. Only bounded here; the field holds it to
    `max_depth`, naming itself."""
    try:
        return exactjson.loads(raw, max_depth + BODY_DEPTH_MARGIN)
    except exactjson.NestedTooDeep as exc:
        raise _nested_too_deep(exc.value, max_depth, field) from None


def _nested_too_deep(cut: Any, max_depth: int, name: str) -> ValidationFailed:
    """The refusal of a body nested deeper than the parsers go, `cut` being what they
    read of it (exactjson.NestedTooDeep), whose deep part is last at every level: the
    answer a body nested just within their reach gets. It names a top-level field, or
    a field of an item of a batch's `tasks` or a claim's `complete` (`tasks[3].payload`,
    as the batch parsers name it); `name` for a body that is not an object."""
    if not isinstance(cut, dict) or not cut:
        return too_deep(name, max_depth)
    key, value = next(reversed(cut.items()))
    if key in _ITEM_LISTS and isinstance(value, list) and value and isinstance(value[-1], dict):
        item = value[-1]
        if item:
            return in_item(too_deep(next(reversed(item)), max_depth), len(value) - 1, key)
    return too_deep(str(key)[:100], max_depth)


def header_text(raw: str | None, field: str) -> str | None:
    """A header value as UTF-8: the server hands headers over decoded as latin-1."""
    if raw is None:
        return None
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise ValidationFailed(f"the {field} header must be UTF-8 text", field=field) from None
