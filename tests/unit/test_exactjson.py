"""exactjson: numbers are never altered, depth is counted without recursion."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gateway import exactjson
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
    digits = "9" * 5000
    value = exactjson.loads(f"[{digits}]".encode(), 64)
    assert isinstance(value[0], exactjson.ExactNumber)
    assert exactjson.dumps(value).decode() == f"[{digits}]"


@pytest.mark.parametrize("raw", [b"[NaN]", b"[Infinity, 1e400]", b"{", b"[1e400,]"])
def test_invalid_json_is_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        exactjson.loads(raw, 64)


def test_numbers_beyond_postgres_numeric_cannot_be_written() -> None:
    value = exactjson.loads(b"[1e200000]", 64)
    with pytest.raises(ValueError, match="beyond what the database can store"):
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
