"""Four rows of the fault matrix, 10 to 15 s each, in every `make test`: Redis
SIGKILLed and restarted, the pub/sub connection killed, one gateway SIGKILLed, and the
janitor's leader SIGKILLed inside a tick pass with Redis restarted. Every task must be
completed exactly once, no empty answer may be stale, and every schedule tick due must
have exactly one task or a recorded skip. The whole matrix is `make faults`."""

from __future__ import annotations

import pytest

from tests.faults.faults import SHORT
from tests.faults.matrix import Timing, run_matrix, table

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHORT_TIMING = Timing(warmup=1.5, after=2.5, drain=15.0)


# Four rows of 10 to 15 s each (about 45 s on a quiet machine): servers up, load,
# fault, drain, check.
@pytest.mark.timeout(150)
async def test_short_fault_matrix_loses_and_duplicates_nothing(pg_admin_url: str) -> None:
    results = await run_matrix(list(SHORT), pg_admin_url, SHORT_TIMING)
    problems = [f"{r.fault}: {line}" for r in results for line in r.problems()[:10]]
    assert all(r.clean for r in results), table(results) + "\n" + "\n".join(problems)
