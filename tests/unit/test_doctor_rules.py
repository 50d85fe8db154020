"""The thresholds of `gateway doctor` that no test here can reach with real servers:
clock skew (this machine's servers share its clock) and the token estimate."""

from __future__ import annotations

import math

from gateway.cli.doctor import SKEW_FAIL_SECONDS, SKEW_WARN_SECONDS, _clock, token_bits


def test_clock_skew_is_fine_below_a_second_a_warning_below_ten_and_then_a_failure() -> None:
    assert _clock("Redis", 0.004).status == "ok"
    assert _clock("Redis", 0.004).text == "clock: Redis is 4 ms ahead of this host"
    assert _clock("Postgres", -0.5).text == "clock: Postgres is 500 ms behind this host"
    assert _clock("Postgres", -SKEW_WARN_SECONDS).status == "warn"
    assert _clock("Postgres", SKEW_FAIL_SECONDS - 0.1).status == "warn"
    assert _clock("Postgres", -SKEW_FAIL_SECONDS).status == "fail"
    assert _clock("Postgres", SKEW_FAIL_SECONDS).details[0].startswith("pause ends")


def test_token_bits_count_the_character_classes_a_token_uses() -> None:
    assert token_bits("a" * 32) == int(32 * math.log2(26)) == 150
    assert token_bits("aA0" * 11) == int(33 * math.log2(62))
    assert token_bits("a-" * 16) == int(32 * math.log2(26 + 32))
