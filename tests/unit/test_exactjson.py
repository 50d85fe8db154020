"""exactjson: numbers are never altered, depth is counted without recursion."""

from __future__ import annotations

import re
from decimal import Decimal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api import exactjson
from gateway.errors import BadRequest, ValidationFailed


def roundtrip(text: str) -> str:
    return exactjson.dumps(exactjson.loads(text.encode(), 64)).decode()


@pytest.mark.parametrize(
    "number",
    [
        "18446744073709551616",
        "18446744073709551615",
        "-9223372036854775808",
        "-9223372036854775809",
        "0.10000000000000000001",
        "1.5e-400",
        "1e400",
        "-1E+400",
        "12345678901234567890123456789012345678901234567890",
        "123456789.123456789",
    ],
)
def test_numbers_survive_parsing_and_writing(number: str) -> None:
    assert Decimal(roundtrip(f"[{number}]")[1:-1]) == Decimal(number)


def test_ordinary_numbers_stay_python_numbers() -> None:
    value = exactjson.loads(b'{"a": 1, "b": 1.5, "c": 12345678901234567890, "d": 0.3}', 64)
    assert value == {"a": 1, "b": 1.5, "c": 12345678901234567890, "d": 0.3}


def test_a_long_digit_string_is_only_a_string() -> None:
    assert exactjson.loads(b'{"id": "12345678901234567890123"}', 64) == {
        "id": "12345678901234567890123"
    }


def test_huge_integer_text_does_not_hit_pythons_digit_limit() -> None:
    longest = "9" * exactjson.MAX_NUMBER_CHARS
    value = exactjson.loads(f"[{longest}]".encode(), 64)
    assert isinstance(value[0], exactjson.ExactNumber)
    assert exactjson.dumps(value).decode() == f"[{longest}]"
    with pytest.raises(ValueError, match="digits written out"):
        exactjson.dumps(exactjson.loads(f"[{longest}9]".encode(), 64))


@pytest.mark.parametrize("raw", [b"[NaN]", b"[Infinity, 1e400]", b"{", b"[1e400,]"])
def test_invalid_json_is_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        exactjson.loads(raw, 64)


def test_numbers_beyond_postgres_numeric_cannot_be_written() -> None:
    value = exactjson.loads(b"[1e200000]", 64)
    with pytest.raises(ValueError, match="longer than 4300 digits written out"):
        exactjson.dumps(value)


def test_depth() -> None:
    assert exactjson.depth(1, 10) == 0
    assert exactjson.depth([], 10) == 1
    assert exactjson.depth({"a": [1, {"b": []}]}, 10) == 4
    deep: object = 1
    for _ in range(100_000):
        deep = [deep]
    assert exactjson.depth(deep, 64) == 65  # stops early, no recursion


def test_too_deep_bodies_name_the_field_before_any_recursive_parse() -> None:
    raw = b'{"ok": 1, "payload": ' + b"[" * 900 + b"1e400" + b"]" * 900 + b"}"
    with pytest.raises(ValidationFailed) as info:
        exactjson.loads(raw, 64)
    assert info.value.extra["field"] == "payload"


# Regression: when orjson stopped first at a number beyond a double (1e400), the exact
# path let a lone surrogate through, which orjson refuses; as a worker_id it reached
# Postgres and the claim was answered 503 store_unavailable.
@pytest.mark.parametrize(
    "raw",
    [
        b'{"n": 1e400, "worker_id": "\\ud800"}',
        b'{"n": 1e400, "a": ["x", {"b": "\\udfff"}]}',
        b'{"n": -1e400, "\\udc00": 1}',
    ],
)
def test_lone_surrogates_are_not_json_on_either_path(raw: bytes) -> None:
    with pytest.raises(BadRequest, match="surrogate"):
        exactjson.loads(raw, 64)
    with pytest.raises(BadRequest, match="surrogate"):
        exactjson.loads(raw.replace(b"1e400", b"1"), 64)


def test_a_surrogate_pair_is_one_character_on_either_path() -> None:
    assert exactjson.loads(b'{"n": 1e400, "s": "\\ud83d\\ude00"}', 64)["s"] == "\U0001f600"
    assert exactjson.loads(b'{"s": "\\ud83d\\ude00"}', 64)["s"] == "\U0001f600"


@pytest.mark.parametrize(
    ("text", "length"),
    [("1e300", 301), ("1.5e-7", 10), ("-1e-5", 8), ("9e131071", 131072), ("12.50", 5)],
)
def test_written_length_is_what_postgres_writes(text: str, length: int) -> None:
    assert exactjson.written_length(text) == length


def test_expansion_counts_numbers_postgres_writes_out() -> None:
    raw = b'[1e300, 2, "1e300 in a string", 1.5]'
    value = exactjson.loads(raw, 64)
    text = exactjson.dumps(value).decode()
    assert exactjson.expansion(text, value) == 301 - len(repr(1e300))
    plain = exactjson.loads(b'["1e300", 15, 2.5]', 64)
    assert exactjson.expansion(exactjson.dumps(plain).decode(), plain) == 0


@pytest.mark.parametrize(
    "number", ["1e-99999999999999999999", "1e99999999999999999999", "0." + "1" * 5000, "9e4300"]
)
def test_numbers_too_long_written_out_cannot_be_written(number: str) -> None:
    value = exactjson.loads(f"[{number}]".encode(), 64)
    with pytest.raises(ValueError, match="digits written out"):
        exactjson.dumps(value)


# What makes a number risky: 16 digits (or points) in a row, or a 3-digit exponent.
RISKY = re.compile(r"\d[\d.]{15}|[eE][+-]?\d{3}")
NUMBERS = st.from_regex(
    r"-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,5})?", fullmatch=True
)
SPACE = st.sampled_from(["", " ", "\n", "\t ", "\r\n  "])


def _documents() -> st.SearchStrategy[tuple[str, list[str]]]:
    """A JSON document as text, in any spacing, and the spellings of its numbers; its
    strings hold the same characters as numbers do, and UUIDs."""
    strings = st.one_of(
        st.text(alphabet="0123456789.eE+-x:,[ ", max_size=30), st.uuids().map(str)
    ).map(lambda t: (orjson.dumps(t).decode(), []))
    numbers = NUMBERS.map(lambda n: (n, [n]))

    def containers(
        children: st.SearchStrategy[tuple[str, list[str]]],
    ) -> st.SearchStrategy[tuple[str, list[str]]]:
        def array(items: list[tuple[tuple[str, list[str]], str]]) -> tuple[str, list[str]]:
            text = "[" + ",".join(f"{space}{t}{space}" for (t, _), space in items) + "]"
            return text, [n for (_, ns), _ in items for n in ns]

        def obj(items: list[tuple[tuple[str, list[str]], str, str]]) -> tuple[str, list[str]]:
            text = "{" + ",".join(f'"k{i}"{sp}:{sp}{t}' for i, ((t, _), sp, _) in enumerate(items))
            return text + "}", [n for (_, ns), _, _ in items for n in ns]

        return st.one_of(
            st.lists(st.tuples(children, SPACE), max_size=4).map(array),
            st.lists(st.tuples(children, SPACE, SPACE), max_size=4).map(obj),
        )

    return st.recursive(st.one_of(strings, numbers), containers, max_leaves=8)


@settings(max_examples=1000, deadline=None)
@given(_documents(), SPACE)
def test_every_document_with_a_risky_number_takes_the_exact_path(
    document: tuple[str, list[str]], space: str
) -> None:
    # The quick test may flag more than the risky numbers, never less.
    text, numbers = document
    raw = (space + text + space).encode()
    if any(RISKY.search(n) for n in numbers):
        assert exactjson.might_be_inexact(raw), text


def test_uuids_and_digits_in_strings_take_the_fast_path() -> None:
    # "4e123" in a UUID, and a string of 16 digits, are no numbers.
    raw = b'{"id": "9f1c2a3b-4e12-4f70-8192-a3b4c5e678f8", "card": "1234567890123456"}'
    assert not exactjson.might_be_inexact(raw)
    assert exactjson.might_be_inexact(b'{"id": "9f1c2a3b-4e12", "n": 1e308}')


@pytest.mark.parametrize("number", ["1e+400", "1E-400", "2.5e308", "12345678.12345678"])
def test_risky_spellings_are_flagged(number: str) -> None:
    assert exactjson.might_be_inexact(f'{{"a": [{number}]}}'.encode())
    assert not exactjson.might_be_inexact(b'{"a": [1e30, 123456789012345, 0.25]}')


# -- bodies nested past the parsers, bodies that expand, repeated keys -----------------


@pytest.mark.parametrize("levels", [1024, 1100, 5000])
def test_a_body_nested_past_the_parsers_is_cut_to_what_they_read(levels):
    raw = b'{"a": "[{\\"", "b": ' + b"[" * levels + b"1" + b"]" * levels + b', "c": 2}'
    with pytest.raises(exactjson.NestedTooDeep) as caught:
        exactjson.loads(raw, 64)
    cut = caught.value.value
    # What comes before the deep part is kept (brackets inside strings are no nesting),
    # the deep part is nested exactly CUT_DEPTH levels, and what follows it is dropped.
    assert list(cut) == ["a", "b"] and cut["a"] == '[{"'
    assert exactjson.depth(cut["b"], 10_000) == exactjson.CUT_DEPTH - 1


def test_a_body_within_the_cut_depth_is_not_cut():
    raw = b"[" * exactjson.CUT_DEPTH + b"]" * exactjson.CUT_DEPTH
    assert exactjson.cut_deep(raw) is None


def test_what_is_not_json_before_the_cut_is_a_bad_request():
    with pytest.raises(BadRequest):
        exactjson.loads(b'{"a": 1 2, "b": ' + b"[" * 2000 + b"]" * 2000 + b"}", 64)


def test_a_deep_part_past_the_scanned_tokens_is_refused_naming_the_body():
    # The cut is searched for in CUT_SCAN_TOKENS tokens at most, so that a large body
    # cannot hold the event loop for seconds; past them the body itself is named.
    prefix = b'{"a": [' + b'"x",' * exactjson.CUT_SCAN_TOKENS + b'"x"], "b": '
    with pytest.raises(ValidationFailed) as caught:
        exactjson.loads(prefix + b"[" * 2000 + b"]" * 2000 + b"}", 64)
    assert caught.value.extra["field"] == "body"
    near = b'{"a": [' + b'"x",' * 1000 + b'"x"], "b": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    with pytest.raises(exactjson.NestedTooDeep):
        exactjson.loads(near, 64)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"a": 1, "a": 1}', "a"),
        (b'[{"x": {"y": 1, "z": 2, "y": 3}}]', "y"),
        (b'{"a": {"a": 1}, "b": {"a": 2}}', None),
        (b'{"\\u0061": 1, "a": 2}', "a"),
        (b"[1e400, 12345678901234567890]", None),
    ],
)
def test_repeated_keys_are_found_in_any_object(raw, key):
    assert exactjson.repeated_key(raw) == key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1e5", True),
        (" -1.5e4", True),
        ('{"a": -12.5E+3}', True),
        ("[1,\n 2e1]", True),
        ('{"lease_id": "0b1e2e3f-2e4f-4e5f-9e6f-7e8f9e0f1e2f", "n": 12}', False),
        ('{"a": "x1e5", "b": 1.5}', False),
    ],
)
def test_only_text_with_a_number_written_with_an_exponent_may_expand(text, expected):
    # A value full of UUIDs is not walked for numbers.
    assert exactjson.may_expand(text) is expected
