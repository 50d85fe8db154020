"""JSON that is kept exactly: what a client sends is what a daemon receives.

orjson reads every number as a 64-bit integer or a double, so 18446744073709551616
would silently become 1.8446744073709552e+19 and 0.10000000000000000001 become 0.1.
Bodies that might hold such a number are parsed again with the standard library,
which keeps each such number as its original text (`ExactNumber`); Postgres jsonb
stores numbers as `numeric`, exactly, and the stored text is sent back verbatim
(`orjson.Fragment`), never re-parsed.
"""

from __future__ import annotations

import itertools
import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from ..errors import BadRequest, ValidationFailed

# A run of 16 digits (dots allowed inside) or an exponent of 3 digits: the only
# spellings a double may not carry exactly. Matches inside strings just take the
# slower exact path. Looked for as substrings of the body with every digit and dot
# written as 0: a superset of what the pattern `\d[\d.]{15}|[eE][+-]?\d{3}` matches
# (a run of dots, or `e.12`, also takes the exact path), found in a tenth of its time.
_AS_ZEROS = bytes.maketrans(b"123456789.", b"0000000000")
_RISKY_RUNS = (b"0" * 16, b"e000", b"E000", b"e+000", b"E+000", b"e-000", b"E-000")
# A number token whose digits (and point) run 16 long, or whose exponent has 3 digits:
# at the start of the document, or after `:`, `,` or `[` and any JSON whitespace.
# (The start of a document is matched apart: `^` as an alternative made every search
# three times as slow.)
_RISKY_NUMBER = re.compile(rb"[:,\[][ \t\r\n]*-?(?:[0-9.]{16}|[0-9.]+[eE][+-]?[0-9]{3})")
_RISKY_FIRST = re.compile(rb"[ \t\r\n]*-?(?:[0-9.]{16}|[0-9.]+[eE][+-]?[0-9]{3})")
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1
# A UTF-16 surrogate left alone by the standard library's parser ("\ud800").
_SURROGATE = re.compile("[\\ud800-\\udfff]")
# Postgres writes numbers out in full (1e300 as 301 digits): a longer number could
# turn a small request into a huge answer, and Python's int() refuses over 4300 digits,
# so such a number could not be read back by a Python daemon either.
MAX_NUMBER_CHARS = 4300
_EXPONENT = re.compile(r"\d[eE]")
# A number with an exponent where JSON text may hold a number: after `[`, `,` or `:`,
# or (matched at the start only) as the whole text. Ids in strings ("…-2e4f…") do not
# match, so a value of UUIDs is not walked; a string that looks like such text just
# is. Possessive, and with no `^|` alternative in the searched pattern, which tripled
# its time.
_EXPONENT_NUMBER = re.compile(r"[\[,:]\s*+-?\d++(?:\.\d++)?[eE]")
_EXPONENT_FIRST = re.compile(r"\s*+-?\d++(?:\.\d++)?[eE]")
# Levels of a body kept when it nests deeper than the parsers go (orjson stops at 1,024,
# the standard library's recursion near 1,000): far above any field's limit
# (GATEWAY_MAX_JSON_DEPTH is at most 200), so what is cut is refused as too deep anyway.
CUT_DEPTH = 512
# Tokens (strings and brackets) read to find where a body is cut, at most: the search
# runs on the event loop, and a 16 MiB body can hold millions of them (a second or
# more). Past this many, the body is refused as too deep without naming a field.
CUT_SCAN_TOKENS = 200_000
# A string (escapes skipped, an unclosed one taken to the end) or a bracket: all that
# decides the nesting of JSON text.
_NESTING_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')


def written_length(text: str) -> int | None:
    """Characters Postgres's numeric writes for the JSON number `text` (never an
    exponent), or None for what is not a finite number."""
    try:
        sign, digits, exponent = Decimal(text).as_tuple()
    except InvalidOperation:  # an exponent beyond what Decimal holds
        return None
    if not isinstance(exponent, int):  # NaN or infinity
        return None
    scale = max(0, -exponent)
    return sign + max(1, len(digits) + exponent) + (1 + scale if scale else 0)


class ExactNumber:
    """A JSON number kept as its text because no int or float holds it exactly."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"ExactNumber({self.text})"

    @property
    def storable(self) -> bool:
        """True when it is written out in at most MAX_NUMBER_CHARS characters."""
        length = written_length(self.text)
        return length is not None and length <= MAX_NUMBER_CHARS

    def __float__(self) -> float:
        return float(self.text)


class UnstorableNumber(ValueError):
    def __init__(self, number: ExactNumber) -> None:
        shown = number.text if len(number.text) <= 40 else number.text[:37] + "..."
        super().__init__(f"the number {shown} is longer than {MAX_NUMBER_CHARS} digits written out")


def _parse_int(text: str) -> int | ExactNumber:
    # Length first: int() refuses more than 4300 digits with an error of its own.
    if len(text) <= 20 and _INT64_MIN <= (value := int(text)) <= _UINT64_MAX:
        return value
    return ExactNumber(text)


def _parse_float(text: str) -> float | ExactNumber:
    value = float(text)
    if value in (float("inf"), float("-inf")) or (value == 0.0 and _EXPONENT.search(text)):
        return ExactNumber(text)  # beyond a double, or an underflow to zero
    try:
        if Decimal(repr(value)) == Decimal(text):
            return value
    except InvalidOperation:
        pass
    return ExactNumber(text)


def may_expand(text: str) -> bool:
    """True when JSON `text` may hold a number written with an exponent, which Postgres
    writes out in full; False when it cannot (found without parsing it). A digit then
    an `e` is looked for first: most values have none, and it takes no time."""
    if not _EXPONENT.search(text):
        return False
    return bool(_EXPONENT_NUMBER.search(text) or _EXPONENT_FIRST.match(text))


def expansion(text: str, value: Any) -> int:
    """How many characters longer `value` (serialized as `text`) comes back from
    Postgres, which writes every number out in full. 0 when no number in `text` has an
    exponent (the usual case, found without walking the value)."""
    if not may_expand(text):
        return 0
    extra = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, float | ExactNumber):
            spelled = node.text if isinstance(node, ExactNumber) else repr(node)
            if "e" in spelled or "E" in spelled:
                extra += max(0, (written_length(spelled) or 0) - len(spelled))
    return extra


def might_be_inexact(raw: bytes) -> bool:
    """True when the body may hold a number a double does not carry exactly: one of 16
    digits or more, or with an exponent of three digits or more."""
    zeros = raw.translate(_AS_ZEROS)
    # Every exponent run holds three zeros: most bodies have none, and need no more
    # searches (this runs on every request with a body).
    if _RISKY_RUNS[0] not in zeros and not (
        b"000" in zeros and any(run in zeros for run in _RISKY_RUNS[1:])
    ):
        return False
    # Runs like these are common inside strings: a UUID holds `e` and three digits more
    # often than not, and a batch acknowledgement carries two UUIDs a task, so the slow
    # parser took 5% of the CPU of a batch-acknowledged drain. A number starts the
    # document or follows `:`, `,` or `[`: only such a run is looked for now (one that
    # a string holds after one of those is still taken, which is only slower).
    return _RISKY_FIRST.match(raw) is not None or _RISKY_NUMBER.search(raw) is not None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


class NestedTooDeep(Exception):
    """The body nests deeper than the parsers go. `value` is what they read of it: its
    text up to the first container deeper than CUT_DEPTH, that container as `0` and
    the open ones closed (cut_deep), so that the caller can name the field it is in."""

    def __init__(self, value: Any) -> None:
        super().__init__("nested deeper than the JSON parsers go")
        self.value = value


def cut_deep(raw: bytes, keep: int = CUT_DEPTH, max_tokens: int = CUT_SCAN_TOKENS) -> bytes | None:
    """`raw` up to its first container opened deeper than `keep` levels, that container
    written as `0` and every open one closed: text the parsers can read, still nested
    `keep` levels deep at the cut. None when `raw` does not nest deeper than `keep`
    within its first `max_tokens` tokens (strings and brackets), read one at a time."""
    opened = bytearray()
    for token in itertools.islice(_NESTING_TOKENS.finditer(raw), max_tokens):
        first = raw[token.start()]
        if first in b"[{":
            if len(opened) == keep:
                closers = bytes(0x5D if c == 0x5B else 0x7D for c in reversed(opened))
                return raw[: token.start()] + b"0" + closers
            opened.append(first)
        elif first in b"]}" and opened:
            opened.pop()
    return None


def _too_deep(raw: bytes) -> Exception:
    """NestedTooDeep with the cut body parsed; BadRequest (raised) when what comes
    before the cut is not JSON."""
    cut = cut_deep(raw)
    if cut is None:  # the deep part lies past CUT_SCAN_TOKENS
        return ValidationFailed("body is nested too deeply (GATEWAY_MAX_JSON_DEPTH)", field="body")
    return NestedTooDeep(loads(cut, CUT_DEPTH + 1))


def loads(raw: bytes, max_depth: int) -> Any:
    """Parse a request body, numbers kept exactly. BadRequest if it is not JSON.
    Before the standard library's recursive parser runs, ValidationFailed names the
    top-level field (or `body`) nested deeper than `max_depth`; otherwise depth is left
    to the fields that store JSON, so a body is not walked twice. A body nested deeper
    than the parsers go raises NestedTooDeep."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise _too_deep(raw) from None
        # orjson refuses numbers beyond a double (1e400); they are valid JSON.
        if "infinity" not in str(exc):
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
    else:
        if not might_be_inexact(raw):
            return value
        _check_depth(value, max_depth)  # before the recursive parser below runs
    try:
        value = json.loads(
            raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant
        )
    except RecursionError:
        raise _too_deep(raw) from None
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if _has_lone_surrogate(value):
        # orjson refuses these on the fast path; so must this one, or a lone surrogate
        # would reach Postgres, which cannot encode it.
        raise BadRequest(
            "request body is not valid JSON: a string holds a lone surrogate (\\ud800-\\udfff)"
        )
    _check_depth(value, max_depth)
    return value


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> None:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _Repeated(key)
        seen.add(key)


def repeated_key(raw: bytes) -> str | None:
    """The first key that an object in `raw` holds twice, or None. `raw` must be JSON
    that loads() has read, so within the standard library parser's depth. Parsers
    disagree on which of two values counts (orjson and Postgres keep the last), so a
    signed body that repeats a key would mean different things to different readers."""
    try:
        json.loads(raw, object_pairs_hook=_unique_pairs, parse_int=len, parse_float=len)
    except _Repeated as repeated:
        return repeated.key
    return None


def _has_lone_surrogate(value: Any) -> bool:
    """True when a string or key anywhere in the value holds a lone UTF-16 surrogate
    (a pair is read as the one character it encodes). Walked without recursion."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _check_depth(value: Any, max_depth: int) -> None:
    items = value.items() if isinstance(value, dict) else [("body", value)]
    limit = max_depth if isinstance(value, dict) else max_depth + 1
    for key, item in items:
        if depth(item, limit) > limit:
            raise ValidationFailed(
                f"{key} is nested too deeply (GATEWAY_MAX_JSON_DEPTH)", field=str(key)[:100]
            )


def _default(value: Any) -> Any:
    if isinstance(value, ExactNumber):
        if not value.storable:
            raise UnstorableNumber(value)
        return orjson.Fragment(value.text)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Serialize a parsed value, ExactNumbers verbatim. Raises ValueError (with a
    message for the client) when it cannot be written or stored."""
    try:
        return orjson.dumps(
            value, default=_default, option=orjson.OPT_SORT_KEYS if sort_keys else 0
        )
    except orjson.JSONEncodeError as exc:
        cause = exc.__cause__
        raise ValueError(str(cause) if isinstance(cause, UnstorableNumber) else str(exc)) from None


def depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed value (a scalar is 0, `[]` is 1), counted without
    recursion; stops early and returns limit + 1 once deeper than `limit`."""
    if not isinstance(value, dict | list):
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if level > deepest:
            deepest = level
            if deepest > limit:
                return limit + 1
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, level + 1))
    return deepest
