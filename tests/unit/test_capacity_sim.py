"""The sharding simulation behind docs/capacity.md: the ring it recommends keeps the
plan's assumptions, and placements the plan rejects are caught by the same checks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bench import capacity_sim as sim


@pytest.fixture(scope="module")
def rates() -> dict[str, float]:
    return sim.zipf_rates(sim.DEFAULT_RUNTIMES, sim.DEFAULT_ZIPF_EXPONENT, sim.DEFAULT_SEED)


class ModuloPlacement:
    """hash mod N: even, but adding a shard reshuffles nearly everything."""

    def __init__(self, shards: Sequence[str], vnodes: int) -> None:
        self._shards = list(shards)

    def shard_of_hash(self, key_hash: int) -> str:
        return self._shards[key_hash % len(self._shards)]


def test_the_planned_ring_keeps_every_assumption(rates: dict[str, float]) -> None:
    rows = sim.simulate(rates, sim.DEFAULT_SHARDS, [sim.PLAN_VNODES])
    assert len(rows) == len(sim.DEFAULT_SHARDS)
    assert sim.violations(rows) == []
    # Adding a shard moves runtimes only onto the new shard, about 1/(N+1) of them.
    for row in rows:
        assert row.strays == 0
        assert row.moved_fraction == pytest.approx(row.expected_moved, rel=0.3)


def test_the_hottest_runtime_sets_the_task_imbalance(rates: dict[str, float]) -> None:
    # A runtime lives on one shard: with Zipf rates the hottest one alone is a tenth of
    # all tasks, so beyond ~10 shards its shard carries twice the mean or more.
    (row,) = sim.simulate(rates, [16], [sim.PLAN_VNODES])
    assert row.hot_runtime_share == pytest.approx(0.102, abs=0.001)
    assert row.tasks_max_over_mean >= row.hot_runtime_share * 16


def test_one_point_per_shard_is_too_uneven(rates: dict[str, float]) -> None:
    rows = sim.simulate(rates, [4, 8], [1])
    found = sim.violations(rows)
    assert any("runtimes max/mean" in line for line in found), found


def test_modulo_hashing_moves_almost_every_runtime(rates: dict[str, float]) -> None:
    rows = sim.simulate(rates, [4, 8], [1], placement=ModuloPlacement)
    for row in rows:
        # N/(N+1) of the runtimes move, most of them between old shards.
        assert row.moved_fraction > 0.7
        assert row.strays > 0
    assert any("moved between old shards" in line for line in sim.violations(rows))


def test_the_hash_is_stable_across_processes() -> None:
    # Python's own hash() of a str is salted per process; a shard map must not be, so
    # these values are pinned: every process and host places rt-000001 on shard-3 of 4.
    assert sim.hash64("rt-000001") == 0xD711A83D191E4DD4
    assert sim.Ring(sim.shard_names(4), 256).shard_of("rt-000001") == "shard-3"


def test_the_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.main(["--runtimes", "2000", "--shards", "2,3", "--vnodes", "256"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| shards | vnodes |")
    assert [line.split("|")[1].strip() for line in out[2:]] == ["2", "3"]
