"""When a process renews the empty verdicts it wrote (pump.renew_after): before the
verdict's end, and spread at random, so that verdicts written together are not all
renewed in one burst."""

from __future__ import annotations

import random

from gateway.claim.pump import RENEW_LEAD_SECONDS, RENEW_SPREAD, renew_after


def test_a_renewal_lands_before_the_verdict_ends() -> None:
    rng = random.Random(3)
    for ttl in (0.2, 1.0, 30.0, 3600.0):
        for _ in range(200):
            after = renew_after(ttl, rng)
            assert 0 < after <= ttl - min(RENEW_LEAD_SECONDS, ttl / 4)
            assert after >= ttl * (1 - RENEW_SPREAD) - min(RENEW_LEAD_SECONDS, ttl / 4)


def test_verdicts_written_together_are_renewed_over_a_fifth_of_their_life() -> None:
    rng = random.Random(7)
    times = sorted(renew_after(30.0, rng) for _ in range(1000))
    # 1,000 verdicts of 30 s written at once: renewed over about 6 s, not in one burst.
    assert times[-1] - times[0] > 5.0
    in_busiest_second = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert in_busiest_second < 250
