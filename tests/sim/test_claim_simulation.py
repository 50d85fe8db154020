"""Seeded random schedules through the real Claimer and VerdictCache over in-memory
Postgres, Redis and pub/sub, on virtual time (see simulation.py for what is modelled
and checked).

SIM_SCHEDULES sets how many seeds run (`make simulate` runs many); SIM_SEED replays
one; SIM_FIRST_SEED moves the window.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from .simulation import run_seed

SCHEDULES = int(os.environ.get("SIM_SCHEDULES", "2000"))
FIRST = int(os.environ.get("SIM_FIRST_SEED", "0"))
BATCHES = 10


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    # Injected Redis failures make the claim path log warnings by design.
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("batch", range(BATCHES))
def test_random_schedules_keep_the_invariants(batch: int) -> None:
    only = os.environ.get("SIM_SEED")
    if only is not None:
        seeds = [int(only)] if batch == 0 else []
    else:
        seeds = list(range(FIRST + batch, FIRST + SCHEDULES, BATCHES))
    for seed in seeds:
        outcome = run_seed(seed)
        assert not outcome.violations, outcome.replay()


def test_a_schedule_replays_identically() -> None:
    a, b = run_seed(7), run_seed(7)
    assert a.ops == b.ops
    assert (a.claims, a.delivered, a.virtual_seconds) == (b.claims, b.delivered, b.virtual_seconds)
    assert a.claims > 0
