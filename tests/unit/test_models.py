"""Request parsers and the JSON forms in gateway/api/ (requests, decode, render)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from gateway.api import bodies, decode, exactjson, render, requests
from gateway.errors import BadRequest, NotFound, PayloadTooLarge, ValidationFailed
from gateway.rows import TaskRow

MAX_PAYLOAD = 1_048_576
LEASE = str(uuid.uuid4())


def fails_on(field: str, fn: Callable[..., Any], *args: Any) -> ValidationFailed:
    """Call fn and assert it raises ValidationFailed naming `field`."""
    with pytest.raises(ValidationFailed) as info:
        fn(*args)
    assert info.value.extra.get("field") == field, info.value.extra
    assert field in info.value.detail or field == "runtime_id"
    return info.value


def enqueue(body: dict[str, Any], header: str | None = None, limit: int = MAX_PAYLOAD) -> Any:
    return requests.parse_enqueue(body, header, limit)


def claim(body: dict[str, Any], max_wait: float = 60.0, lease: int = 45) -> Any:
    return requests.parse_claim(body, max_wait, lease)


# --- parse_enqueue ------------------------------------------------------------------------


def test_enqueue_defaults() -> None:
    req = enqueue({"payload": {"a": [1, 2]}})
    assert req.payload_json == '{"a":[1,2]}'
    assert req.priority == 50
    assert req.max_attempts == 5
    assert req.run_at is None
    assert req.delay_seconds is None and req.ttl_seconds is None
    assert req.idempotency_key is None
    assert len(req.request_hash) == 64


def test_enqueue_payload_is_required() -> None:
    fails_on("payload", enqueue, {})
    fails_on("payload", enqueue, {"priority": 1})


@pytest.mark.parametrize("payload", [None, 0, "", [], {}, "text", 1.5, False])
def test_enqueue_payload_may_be_any_json(payload: Any) -> None:
    import orjson

    req = enqueue({"payload": payload})
    assert orjson.loads(req.payload_json) == payload


@pytest.mark.parametrize("value", [0, 1, 50, 999, 1000])
def test_enqueue_priority_in_range(value: int) -> None:
    assert enqueue({"payload": 1, "priority": value}).priority == value


@pytest.mark.parametrize("value", [-1, 1001, 10**9, 5.5, "5", True, False, [], {}])
def test_enqueue_priority_refused(value: Any) -> None:
    fails_on("priority", enqueue, {"payload": 1, "priority": value})


def test_enqueue_priority_null_means_default() -> None:
    assert enqueue({"payload": 1, "priority": None}).priority == 50


@pytest.mark.parametrize("value", [1, 100])
def test_enqueue_max_attempts_in_range(value: int) -> None:
    assert enqueue({"payload": 1, "max_attempts": value}).max_attempts == value


@pytest.mark.parametrize("value", [0, 101, -3, 2.5, True, "3"])
def test_enqueue_max_attempts_refused(value: Any) -> None:
    fails_on("max_attempts", enqueue, {"payload": 1, "max_attempts": value})


def test_enqueue_delay_and_run_at_together_refused() -> None:
    with pytest.raises(ValidationFailed) as info:
        enqueue({"payload": 1, "delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"})
    assert info.value.extra.get("field") in ("delay_seconds", "run_at")


def test_enqueue_delay_is_kept_for_the_database_clock() -> None:
    # run_at is worked out by Postgres, on the clock created_at and leases use.
    req = enqueue({"payload": 1, "delay_seconds": 90})
    assert (req.delay_seconds, req.run_at) == (90, None)


def test_enqueue_zero_delay_is_no_delay() -> None:
    req = enqueue({"payload": 1, "delay_seconds": 0})
    assert (req.delay_seconds, req.run_at) == (None, None)


@pytest.mark.parametrize("value", [-1, 365 * 86400 + 1, "5", True])
def test_enqueue_delay_refused(value: Any) -> None:
    fails_on("delay_seconds", enqueue, {"payload": 1, "delay_seconds": value})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2030-01-02T03:04:05Z", datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2030-01-02T03:04:05.123456Z", datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
        ("2030-01-02T05:04:05+02:00", datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
        ("2030-01-02t03:04:05z", datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ],
)
def test_enqueue_run_at_parsed(raw: str, expected: datetime) -> None:
    run_at = enqueue({"payload": 1, "run_at": raw}).run_at
    assert run_at == expected
    assert run_at is not None and run_at.tzinfo is not None


@pytest.mark.parametrize(
    "raw", ["2030-01-02T03:04:05", "2030-01-02", "tomorrow", "", 1700000000, True, ["x"]]
)
def test_enqueue_run_at_needs_a_zoned_time_string(raw: Any) -> None:
    fails_on("run_at", enqueue, {"payload": 1, "run_at": raw})


def test_enqueue_ttl_is_kept_for_the_database_clock() -> None:
    req = enqueue({"payload": 1, "ttl_seconds": 60})
    assert (req.ttl_seconds, req.run_at, req.delay_seconds) == (60, None, None)
    req = enqueue({"payload": 1, "run_at": "2030-01-01T00:00:00Z", "ttl_seconds": 30})
    assert req.ttl_seconds == 30 and req.run_at == datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("value", [0, 0.5, -1, 365 * 86400 + 1, "60", False])
def test_enqueue_ttl_refused(value: Any) -> None:
    fails_on("ttl_seconds", enqueue, {"payload": 1, "ttl_seconds": value})


def test_enqueue_payload_limit_counts_serialized_bytes() -> None:
    # "aaaaaaaaaa" serializes to 12 bytes with its quotes.
    assert enqueue({"payload": "a" * 10}, limit=12).payload_json == '"' + "a" * 10 + '"'
    with pytest.raises(PayloadTooLarge) as info:
        enqueue({"payload": "a" * 10}, limit=11)
    assert info.value.extra.get("field") == "payload"
    # Bytes, not characters: "éé" is 6 bytes serialized.
    enqueue({"payload": "éé"}, limit=6)
    with pytest.raises(PayloadTooLarge):
        enqueue({"payload": "éé"}, limit=5)


def test_enqueue_payload_over_default_limit() -> None:
    with pytest.raises(PayloadTooLarge):
        enqueue({"payload": "x" * MAX_PAYLOAD})


def test_enqueue_idempotency_key_from_body_or_header() -> None:
    assert enqueue({"payload": 1, "idempotency_key": "k1"}).idempotency_key == "k1"
    assert enqueue({"payload": 1}, header="k2").idempotency_key == "k2"
    assert enqueue({"payload": 1, "idempotency_key": "k3"}, header="k3").idempotency_key == "k3"


def test_enqueue_idempotency_key_body_header_mismatch() -> None:
    with pytest.raises(BadRequest):
        enqueue({"payload": 1, "idempotency_key": "a"}, header="b")


def test_enqueue_idempotency_key_limits() -> None:
    assert enqueue({"payload": 1, "idempotency_key": "k" * 200}).idempotency_key == "k" * 200
    fails_on("idempotency_key", enqueue, {"payload": 1, "idempotency_key": "k" * 201})
    fails_on("idempotency_key", enqueue, {"payload": 1, "idempotency_key": ""})
    fails_on("idempotency_key", enqueue, {"payload": 1, "idempotency_key": 7})
    assert enqueue({"payload": 1}, header="h" * 200).idempotency_key == "h" * 200
    with pytest.raises(ValidationFailed) as info:
        enqueue({"payload": 1}, header="h" * 201)
    assert info.value.extra.get("field") == "idempotency_key"
    with pytest.raises(ValidationFailed) as info:
        enqueue({"payload": 1}, header="")
    assert info.value.extra.get("field") == "idempotency_key"


def test_enqueue_same_request_same_hash() -> None:
    body = {"payload": {"a": 1, "b": [1, 2]}, "priority": 7, "ttl_seconds": 60}
    assert enqueue(dict(body)).request_hash == enqueue(dict(body)).request_hash
    # Key order does not matter, at any depth.
    reordered = {"ttl_seconds": 60, "priority": 7, "payload": {"b": [1, 2], "a": 1}}
    assert enqueue(reordered).request_hash == enqueue(body).request_hash
    # The key itself is not part of the request it names.
    assert (
        enqueue(body, header="k1").request_hash
        == enqueue({**body, "idempotency_key": "k2"}).request_hash
    )


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"a": 2, "b": [1, 2]}},
        {"payload": {"a": 1, "b": [2, 1]}},
        {"payload": "x"},
        {"priority": 8},
        {"ttl_seconds": 61},
        {"max_attempts": 3},
        {"delay_seconds": 5},
    ],
)
def test_enqueue_different_request_different_hash(change: dict[str, Any]) -> None:
    body = {"payload": {"a": 1, "b": [1, 2]}, "priority": 7, "ttl_seconds": 60}
    assert enqueue({**body, **change}).request_hash != enqueue(body).request_hash


def test_enqueue_run_at_changes_hash() -> None:
    a = enqueue({"payload": 1, "run_at": "2030-01-01T00:00:00Z"})
    b = enqueue({"payload": 1, "run_at": "2030-01-01T00:00:01Z"})
    assert a.request_hash != b.request_hash


# --- parse_claim --------------------------------------------------------------------------


def test_claim_defaults() -> None:
    req = claim({"worker_id": "w1"}, lease=45)
    assert req.worker_id == "w1"
    assert req.max_tasks == 1
    assert req.wait_seconds == 0.0
    assert req.lease_seconds == 45


def _read_both(body: dict[str, Any], max_wait: float, lease: int) -> tuple[object, object]:
    """parse_claim's answer and claim_by_fields', each a ClaimRequest or the error's
    (type, field, message)."""
    out: list[object] = []
    for parse in (requests.parse_claim, requests.claim_by_fields):
        try:
            out.append(parse(body, max_wait, lease))
        except ValidationFailed as exc:
            out.append((type(exc), exc.extra, str(exc)))
    return out[0], out[1]


_WORKERS: list[object] = ["w", "x" * 200, "x" * 201, "", "a\x00b", 7, None, True, ["w"]]
_NUMBERS: list[object] = [
    None,
    0,
    1,
    2.5,
    -0.0,
    -1,
    60,
    61,
    100,
    101,
    3600,
    3601,
    2.0,
    True,
    "1",
    exactjson.ExactNumber("18446744073709551616"),
]


@pytest.mark.parametrize("worker", _WORKERS)
@pytest.mark.parametrize("field", ["wait_seconds", "max_tasks", "lease_seconds"])
@pytest.mark.parametrize("lease", [45, 0, 3601])
def test_the_usual_claim_reads_as_its_fields_read_it(
    worker: object, field: str, lease: int
) -> None:
    """parse_claim reads a plain body without the fields; every body, plain or not,
    reads as CLAIM_BODY's fields read it (the same request, or the same error)."""
    for number in _NUMBERS:
        body = {"worker_id": worker, field: number}
        fast, fields = _read_both(body, 60.0, lease)
        assert fast == fields, body
        assert type(fast) is type(fields)


def test_claim_values() -> None:
    req = claim({"worker_id": "w", "max_tasks": 100, "wait_seconds": 60, "lease_seconds": 3600})
    assert (req.max_tasks, req.wait_seconds, req.lease_seconds) == (100, 60.0, 3600)
    assert claim({"worker_id": "w", "wait_seconds": 2.5}).wait_seconds == 2.5


@pytest.mark.parametrize("value", [None, "", 5, ["w"], "w" * 201])
def test_claim_worker_id_refused(value: Any) -> None:
    body = {} if value is None else {"worker_id": value}
    fails_on("worker_id", claim, body)


def test_claim_worker_id_200_chars_ok() -> None:
    assert claim({"worker_id": "w" * 200}).worker_id == "w" * 200


@pytest.mark.parametrize("value", [0, 101, -1, 1.5, True, "2"])
def test_claim_max_tasks_refused(value: Any) -> None:
    fails_on("max_tasks", claim, {"worker_id": "w", "max_tasks": value})


@pytest.mark.parametrize("value", [60.001, 61, 3600, -0.1, "1", True])
def test_claim_wait_seconds_refused(value: Any) -> None:
    fails_on("wait_seconds", claim, {"worker_id": "w", "wait_seconds": value})


def test_claim_wait_cap_is_the_server_setting() -> None:
    assert claim({"worker_id": "w", "wait_seconds": 10}, max_wait=10).wait_seconds == 10
    fails_on("wait_seconds", claim, {"worker_id": "w", "wait_seconds": 10.5}, 10)
    fails_on("wait_seconds", claim, {"worker_id": "w", "wait_seconds": 1}, 0)


@pytest.mark.parametrize("value", [0, 3601, -5, 30.5, False, "60"])
def test_claim_lease_seconds_refused(value: Any) -> None:
    fails_on("lease_seconds", claim, {"worker_id": "w", "lease_seconds": value})


def test_parse_lease_seconds() -> None:
    assert requests.parse_lease_seconds({}, 77) == 77
    assert requests.parse_lease_seconds({"lease_seconds": 3600}, 77) == 3600
    fails_on("lease_seconds", requests.parse_lease_seconds, {"lease_seconds": 0}, 77)
    fails_on("lease_seconds", requests.parse_lease_seconds, {"lease_seconds": 3601}, 77)


# --- parse_fail / parse_lease_id ----------------------------------------------------------


def test_fail_defaults() -> None:
    req = requests.parse_fail({"lease_id": LEASE, "error": "boom"})
    assert req.lease_id == uuid.UUID(LEASE)
    assert req.error == "boom"
    assert req.retry is True
    assert req.retry_after_seconds is None


def test_fail_values() -> None:
    req = requests.parse_fail(
        {"lease_id": LEASE, "error": "e", "retry": False, "retry_after_seconds": 7 * 86400}
    )
    assert req.retry is False
    assert req.retry_after_seconds == 7 * 86400


def test_fail_error_truncated() -> None:
    req = requests.parse_fail({"lease_id": LEASE, "error": "x" * 20_000})
    assert len(req.error) == bodies.MAX_ERROR_CHARS


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"lease_id": LEASE}, "error"),
        ({"lease_id": LEASE, "error": None}, "error"),
        ({"lease_id": LEASE, "error": 5}, "error"),
        ({"lease_id": LEASE, "error": "e", "retry": "yes"}, "retry"),
        ({"lease_id": LEASE, "error": "e", "retry": 1}, "retry"),
        ({"error": "e"}, "lease_id"),
        ({"lease_id": "nope", "error": "e"}, "lease_id"),
        ({"lease_id": LEASE, "error": "e", "retry_after_seconds": -1}, "retry_after_seconds"),
        (
            {"lease_id": LEASE, "error": "e", "retry_after_seconds": 7 * 86400 + 1},
            "retry_after_seconds",
        ),
        ({"lease_id": LEASE, "error": "e", "retry_after_seconds": "5"}, "retry_after_seconds"),
    ],
)
def test_fail_refused(body: dict[str, Any], field: str) -> None:
    fails_on(field, requests.parse_fail, body)


def test_parse_lease_id() -> None:
    assert requests.parse_lease_id({"lease_id": LEASE}) == uuid.UUID(LEASE)
    assert requests.parse_lease_id({"lease_id": LEASE.upper()}) == uuid.UUID(LEASE)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"lease_id": None},
        {"lease_id": ""},
        {"lease_id": 5},
        {"lease_id": "not-a-uuid"},
        {"lease_id": LEASE + "0"},
        {"lease_id": "a" * 65},
    ],
)
def test_parse_lease_id_refused(body: dict[str, Any]) -> None:
    fails_on("lease_id", requests.parse_lease_id, body)


def test_check_task_id() -> None:
    assert decode.check_task_id(LEASE) == uuid.UUID(LEASE)
    with pytest.raises(NotFound):
        decode.check_task_id("nope")


# --- decode_body --------------------------------------------------------------------------


def test_decode_empty_body_is_empty_object() -> None:
    assert decode.decode_body(b"") == {}


@pytest.mark.parametrize("raw", [b"   ", b"\n\t ", b"\r\n\r\n"])
def test_decode_whitespace_alone_is_bad_request(raw: bytes) -> None:
    # No JSON text (RFC 8259: whitespace around one value); schemathesis sent it to
    # `:pause`, which took it for an empty body.
    with pytest.raises(BadRequest) as info:
        decode.decode_body(raw)
    assert "not valid JSON" in info.value.detail


def test_decode_object() -> None:
    assert decode.decode_body(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}


@pytest.mark.parametrize(
    "raw", [b"not json", b"{", b'{"a": 1,}', b"\xff\xfe", b"NaN", b'{"a": Infinity}']
)
def test_decode_non_json_is_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        decode.decode_body(raw)


@pytest.mark.parametrize("raw", [b"[]", b'[{"a": 1}]', b'"s"', b"1", b"null", b"true"])
def test_decode_non_object_is_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        decode.decode_body(raw)
    assert not isinstance(info.value, ValidationFailed)


# --- check_runtime_id ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "runtime_id", ["a", "Z", "0", "rt-1", "a.b_c:d-e", "9" + "x" * 127, "A" * 128]
)
def test_runtime_id_accepted(runtime_id: str) -> None:
    assert decode.check_runtime_id(runtime_id) == runtime_id


@pytest.mark.parametrize(
    "runtime_id",
    ["", "-a", ".a", "_a", ":a", "a" * 129, "a/b", "a b", "a{b", "a}b", "é", "a\tb", "a*"],
)
def test_runtime_id_refused(runtime_id: str) -> None:
    fails_on("runtime_id", decode.check_runtime_id, runtime_id)


# Regression: with `$` and re.match, "rt\n" (URL path rt%0A) used to pass as a runtime id.
@pytest.mark.parametrize("runtime_id", ["rt\n", "A" * 128 + "\n"])
def test_runtime_id_with_trailing_newline_refused(runtime_id: str) -> None:
    fails_on("runtime_id", decode.check_runtime_id, runtime_id)


# --- format_time / task_json --------------------------------------------------------------


def test_format_time_utc_micro_z() -> None:
    value = datetime(2026, 11, 25, 21, 2, 3, 123456, tzinfo=UTC)
    assert render.format_time(value) == "2026-11-25T21:02:03.123456Z"


def test_format_time_keeps_zero_microseconds() -> None:
    value = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert render.format_time(value) == "2026-01-02T03:04:05.000000Z"


def test_format_time_converts_to_utc() -> None:
    value = datetime(2026, 1, 1, 1, 30, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    assert render.format_time(value) == "2025-12-31T23:30:00.000005Z"


def test_format_time_matches_isoformat_through_its_kept_seconds() -> None:
    """Times of many seconds, in and out of the kept ones, past the bound that forgets
    them, the years' edges too: each is isoformat's text, in UTC, with Z."""
    base = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
    moments = [base + timedelta(seconds=n // 3, microseconds=n * 7919) for n in range(15_000)]
    moments += [datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, UTC)]
    for moment in moments + moments[::-1]:
        expected = moment.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
        assert render.format_time(moment) == expected
    assert len(render._SECONDS) <= render.SECONDS_KEPT


def test_format_time_none() -> None:
    assert render.format_time(None) is None


def test_format_time_strings_sort_in_time_order() -> None:
    base = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
    times = [
        base,
        base + timedelta(microseconds=1),
        base + timedelta(microseconds=10),
        base + timedelta(seconds=1),
        base + timedelta(seconds=9, microseconds=999999),
        base + timedelta(seconds=10),
        base + timedelta(days=1),
        base.replace(year=2027, month=1, day=1),
        base.astimezone(timezone(timedelta(hours=-5))) + timedelta(hours=2),
        base.astimezone(timezone(timedelta(hours=9))) - timedelta(microseconds=3),
    ]
    strings = [render.format_time(t) for t in times]
    assert sorted(strings, key=str) == [render.format_time(t) for t in sorted(times)]
    assert len(set(strings)) == len(times)
    assert all(s is not None and s.endswith("Z") and len(s) == 27 for s in strings)


def _row(**over: Any) -> TaskRow:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    row: dict[str, Any] = {
        "id": uuid.UUID(LEASE),
        "runtime_id": "rt",
        "status": "queued",
        "priority": 50,
        "payload": {"a": 1},
        "attempts": 0,
        "max_attempts": 5,
        "run_at": None,
        "expires_at": None,
        "created_at": now,
        "updated_at": now,
        "lease_id": None,
        "lease_expires_at": None,
        "worker_id": None,
        "cancel_requested": False,
        "result": None,
        "last_error": None,
        "schedule": None,
        "scheduled_for": None,
        "trace_parent": None,
        "trace_state": None,
    }
    row.update(over)
    return TaskRow.of(row)


def test_task_json_queued() -> None:
    out = render.task_json(_row())
    assert out["id"] == LEASE
    assert out["created_at"] == "2026-01-01T00:00:00.000000Z"
    assert out["run_at"] is None
    assert set(out) == set(render.TASK_FIELDS)


def test_task_json_claimed_has_lease_fields() -> None:
    lease = uuid.uuid4()
    out = render.task_json(
        _row(
            status="claimed",
            lease_id=lease,
            lease_expires_at=datetime(2026, 1, 1, 0, 1, tzinfo=UTC),
            worker_id="w",
            cancel_requested=True,
        )
    )
    assert out["lease_id"] == str(lease)
    assert out["lease_expires_at"] == "2026-01-01T00:01:00.000000Z"
    assert out["worker_id"] == "w"
    assert out["cancel_requested"] is True


def test_task_json_finished() -> None:
    done = render.task_json(_row(status="completed", result={"ok": True}))
    assert done["result"] == {"ok": True}
    assert "lease_id" not in done
    dead = render.task_json(_row(status="dead", last_error="boom"))
    assert dead["last_error"] == "boom"
    assert "result" not in dead


def test_result_json() -> None:
    assert requests.result_json({}, 100) is None
    assert requests.result_json({"result": [1]}, 100) == "[1]"
    with pytest.raises(PayloadTooLarge) as info:
        requests.result_json({"result": "x" * 10}, 5)
    assert info.value.extra.get("field") == "result"


def test_enqueue_spelled_out_defaults_hash_like_omitted_ones() -> None:
    # A retry that spells out a default is the same request, not a key reuse.
    assert (
        enqueue({"payload": 1}).request_hash
        == enqueue({"payload": 1, "priority": 50, "max_attempts": 5}).request_hash
    )
    assert (
        enqueue({"payload": 1}).request_hash != enqueue({"payload": 1, "priority": 51}).request_hash
    )


def test_format_time_pads_years_to_four_digits() -> None:
    from datetime import UTC, datetime

    assert render.format_time(datetime(999, 6, 1, tzinfo=UTC)) == "0999-06-01T00:00:00.000000Z"


def nested(levels: int, inner: Any = None) -> Any:
    value = inner
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("max_depth", [1, 3, 64])
def test_payload_depth_is_checked_whatever_its_length(max_depth: int) -> None:
    # Short texts are not walked (each level takes two characters), so the limit is
    # held at both lengths: exactly 2 * max_depth characters, and padded longer.
    def parse(payload: Any) -> Any:
        return requests.parse_enqueue({"payload": payload}, None, MAX_PAYLOAD, max_depth)

    assert len(exactjson.dumps(nested(max_depth - 1, []))) == 2 * max_depth
    parse(nested(max_depth - 1, []))
    parse(nested(max_depth - 1, ["x" * 500]))
    error = fails_on("payload", parse, nested(max_depth, []))
    assert "nested more than" in error.detail
    fails_on("payload", parse, nested(max_depth + 1))
    fails_on("payload", parse, nested(max_depth, ["x" * 500]))


def test_a_payload_too_deep_to_serialize_is_refused_as_too_deep() -> None:
    error = fails_on(
        "payload", requests.parse_enqueue, {"payload": nested(600)}, None, MAX_PAYLOAD, 1000
    )
    assert "nested more than 1000 levels" not in error.detail  # 600 is within the limit
    error = fails_on(
        "payload", requests.parse_enqueue, {"payload": nested(600)}, None, MAX_PAYLOAD, 64
    )
    assert "nested more than 64 levels" in error.detail


def test_a_batch_item_hashes_as_a_single_enqueue_when_it_has_a_key() -> None:
    keyed = {"payload": {"b": 1, "a": [2]}, "priority": 7, "idempotency_key": "k"}
    items = requests.parse_batch({"tasks": [keyed, {"payload": 1}]}, MAX_PAYLOAD)
    assert items[0].request_hash == enqueue(keyed).request_hash
    assert len(items[0].request_hash) == 64
    assert items[1].idempotency_key is None and items[1].request_hash == ""


BATCH_ITEMS: list[Any] = [
    {"payload": None},
    {"payload": {"k": 0, "i": 1}},
    {"payload": [exactjson.ExactNumber("1e400"), "é", {"b": 1, "a": 2}]},
    {"payload": "x", "priority": None, "run_at": None},
    {"payload": 3, "priority": 9, "ttl_seconds": 60, "delay_seconds": 1.5},
    {"payload": 4, "run_at": "2030-01-01T00:00:00Z", "max_attempts": 2, "other": 1},
]


def test_batch_items_read_as_single_enqueues_without_a_hash() -> None:
    # Items with a payload alone take a shorter path; they must read the same.
    parsed = requests.parse_batch({"tasks": BATCH_ITEMS}, MAX_PAYLOAD)
    assert parsed == [enqueue(item)._replace(request_hash="") for item in BATCH_ITEMS]


@pytest.mark.parametrize(
    "bad",
    [
        {"payload": "\x00"},
        {"payload": "x" * 200},
        {"payload": nested(65)},
        {"payload": exactjson.ExactNumber("9e4300")},
        {"priority": 3},
        {"payload": 1, "priority": 5000, "max_attempts": 0, "run_at": "soon"},
        {"payload": 1, "delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"},
        {"payload": 1, "idempotency_key": ""},
    ],
)
def test_a_bad_batch_item_is_refused_as_the_single_enqueue_is_naming_its_index(bad: Any) -> None:
    with pytest.raises((ValidationFailed, PayloadTooLarge)) as single:
        requests.parse_enqueue(bad, None, 100)
    items = [{"payload": i} for i in range(5)] + [bad, {"payload": "after"}]
    with pytest.raises(type(single.value)) as batch:
        requests.parse_batch({"tasks": items}, 100)
    assert batch.value.detail == f"tasks[5]: {single.value.detail}"
    assert batch.value.extra["field"] == f"tasks[5].{single.value.extra['field']}"
    assert batch.value.extra["index"] == 5


# -- what a request's JSON values come to, written out (GATEWAY_MAX_BODY_BYTES) --------


def _batch_of(number: str, per_item: int, items: int) -> dict:
    payload = "[" + ",".join([number] * per_item) + "]"
    return decode.decode_body(
        ('{"tasks": [' + ",".join([f'{{"payload": {payload}}}'] * items) + "]}").encode()
    )


@pytest.mark.parametrize(
    ("number", "written"),
    # 1e300 is written as 301 digits; 9e15 is read as a double and stored as
    # 9000000000000000.0, 18 characters for 4 sent.
    [("1e300", 301), ("9e15", 18), ("-1E-5", 8)],
)
def test_a_batch_is_bounded_by_its_payloads_written_out_together(number, written):
    per_item, items = 10, 5
    size = items * (per_item * (written + 1) + 1)  # each payload: numbers, commas, brackets
    body = _batch_of(number, per_item, items)
    assert len(requests.parse_batch(body, 1 << 20, 64, max_body_bytes=size)) == items
    with pytest.raises(PayloadTooLarge) as caught:
        requests.parse_batch(body, 1 << 20, 64, max_body_bytes=size - 1)
    # The request as a whole is named, not the item that passed the limit.
    assert caught.value.extra == {"field": "body"}
    assert "GATEWAY_MAX_BODY_BYTES" in caught.value.detail


def test_a_single_payload_and_a_result_are_bounded_written_out_too():
    body = decode.decode_body(b'{"payload": [1e300, 1e300], "result": [1e300]}')
    assert requests.parse_enqueue(body, None, 1 << 20, 64, max_body_bytes=605)
    with pytest.raises(PayloadTooLarge) as caught:
        requests.parse_enqueue(body, None, 1 << 20, 64, max_body_bytes=604)
    assert caught.value.extra == {"field": "body"}
    budget = requests.written_budget(303)
    assert requests.result_json(body, 1 << 20, 64, budget) is not None
    with pytest.raises(PayloadTooLarge):
        requests.result_json(body, 1 << 20, 64, budget)  # the same budget: 606 in all


def test_the_payload_limit_still_names_the_payload():
    body = decode.decode_body(b'{"payload": [1e300, 1e300]}')
    with pytest.raises(PayloadTooLarge) as caught:
        requests.parse_enqueue(body, None, 600, 64, max_body_bytes=10_000)
    assert caught.value.extra == {"field": "payload"}
