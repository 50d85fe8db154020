"""`python -m bench.capacity_sim`: checks the sharding plan of docs/capacity.md on paper.

Independent of the gateway: runtimes with a skewed (Zipf) task rate are placed on N
Postgres shards by a consistent hash of the runtime id with virtual nodes, and the
table shows, for each shard count and virtual-node count:

- runtimes max/mean: the most-loaded shard's runtime count over the mean (1.0 is even);
- tasks max/mean: the same for the task rate (skewed: one hot runtime weighs a lot);
- hot runtime share: the hottest runtime's share of all tasks (a runtime lives on one
  shard, so no shard count spreads it);
- moved: the fraction of runtimes that change shard when shard N+1 is added (consistent
  hashing moves about 1/(N+1), and only to the new shard);
- strays: runtimes that moved between two old shards when one was added (must be 0);
- tasks expected: N x hot + (1 - hot), the load over the mean of the shard holding the
  hottest runtime when the rest is spread evenly: the imbalance to plan for, which
  no hash of whole runtimes can remove.

`violations()` checks the rows against what the plan assumes (PLAN_*); the unit test
runs it, and also shows that a wrong placement (modulo hashing, one point per shard)
fails it.

Everything is deterministic: the hash is BLAKE2b (not Python's salted `hash`), and the
Zipf weights are assigned to runtimes by a seeded shuffle.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

DEFAULT_RUNTIMES = 10_000
DEFAULT_ZIPF_EXPONENT = 1.0
DEFAULT_SHARDS = tuple(range(2, 17))
DEFAULT_VNODES = (1, 16, 64, 256)
DEFAULT_SEED = 1

# What docs/capacity.md assumes of the ring it recommends.
PLAN_VNODES = 256
# Size each shard this far above the mean runtime count (and the task rate spread evenly).
PLAN_MAX_RUNTIME_IMBALANCE = 1.25
# The hottest shard's task rate stays below this multiple of Row.tasks_expected.
PLAN_MAX_TASKS_OVER_EXPECTED = 1.25
# Adding shard N+1 moves 1/(N+1) of the runtimes, give or take this share of it.
PLAN_MOVED_TOLERANCE = 0.3


def hash64(key: str) -> int:
    """A stable 64-bit hash of `key`: the same on every process, host and version."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class Placement(Protocol):
    def shard_of_hash(self, key_hash: int) -> str: ...


class Ring:
    """A consistent-hash ring: each shard owns `vnodes` points; a key belongs to the
    shard of the first point at or after the key's hash, wrapping around."""

    def __init__(self, shards: Sequence[str], vnodes: int) -> None:
        points = sorted((hash64(f"{shard}#{v}"), shard) for shard in shards for v in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [s for _, s in points]

    def shard_of_hash(self, key_hash: int) -> str:
        i = bisect.bisect_left(self._hashes, key_hash)
        return self._owners[i % len(self._owners)]

    def shard_of(self, key: str) -> str:
        return self.shard_of_hash(hash64(key))


def shard_names(n: int) -> list[str]:
    return [f"shard-{i}" for i in range(n)]


def zipf_rates(runtimes: int, exponent: float, seed: int) -> dict[str, float]:
    """Task rate per runtime id, shares summing to 1: rank k weighs 1/k**exponent; ranks
    are dealt to the ids by a seeded shuffle, so the hot ones sit anywhere on the ring."""
    ids = [f"rt-{i:06d}" for i in range(runtimes)]
    weights = [1.0 / (k**exponent) for k in range(1, runtimes + 1)]
    total = sum(weights)
    random.Random(seed).shuffle(ids)
    return {rt: w / total for rt, w in zip(ids, weights, strict=True)}


@dataclass(frozen=True)
class Row:
    shards: int
    vnodes: int
    runtimes_max_over_mean: float
    tasks_max_over_mean: float
    hot_runtime_share: float
    moved_fraction: float  # when shard number shards+1 is added
    expected_moved: float  # 1 / (shards + 1)
    strays: int  # runtimes moved between two old shards: consistent hashing makes none

    @property
    def tasks_expected(self) -> float:
        """The task rate over the mean of a shard holding the hottest runtime and an even
        share of the rest."""
        return self.shards * self.hot_runtime_share + (1.0 - self.hot_runtime_share)


def simulate(
    rates: dict[str, float],
    shard_counts: Sequence[int],
    vnode_counts: Sequence[int],
    placement: Callable[[Sequence[str], int], Placement] = Ring,
) -> list[Row]:
    """One row per (vnodes, shards): placement(shard names, vnodes) places the runtimes."""
    hashes = {rt: hash64(rt) for rt in rates}
    hot = max(rates.values())
    rows = []
    for vnodes in vnode_counts:
        for n in shard_counts:
            before = placement(shard_names(n), vnodes)
            after = placement(shard_names(n + 1), vnodes)
            count = dict.fromkeys(shard_names(n), 0)
            load = dict.fromkeys(shard_names(n), 0.0)
            moved = strays = 0
            new_shard = shard_names(n + 1)[-1]
            for rt, rate in rates.items():
                old = before.shard_of_hash(hashes[rt])
                new = after.shard_of_hash(hashes[rt])
                count[old] += 1
                load[old] += rate
                if old != new:
                    moved += 1
                    strays += new != new_shard
            rows.append(
                Row(
                    shards=n,
                    vnodes=vnodes,
                    runtimes_max_over_mean=max(count.values()) / (len(rates) / n),
                    tasks_max_over_mean=max(load.values()) / (1.0 / n),
                    hot_runtime_share=hot,
                    moved_fraction=moved / len(rates),
                    expected_moved=1.0 / (n + 1),
                    strays=strays,
                )
            )
    return rows


def violations(rows: Sequence[Row]) -> list[str]:
    """What in `rows` breaks the plan's assumptions (PLAN_*), one line each; [] if none."""
    found = []
    for r in rows:
        where = f"{r.shards} shards, {r.vnodes} vnodes"
        if r.strays:
            found.append(f"{where}: {r.strays} runtimes moved between old shards")
        if abs(r.moved_fraction - r.expected_moved) > PLAN_MOVED_TOLERANCE * r.expected_moved:
            found.append(
                f"{where}: adding a shard moved {r.moved_fraction:.3f} of the runtimes, "
                f"not about {r.expected_moved:.3f}"
            )
        if r.runtimes_max_over_mean > PLAN_MAX_RUNTIME_IMBALANCE:
            found.append(f"{where}: runtimes max/mean {r.runtimes_max_over_mean:.2f}")
        if r.tasks_max_over_mean > PLAN_MAX_TASKS_OVER_EXPECTED * r.tasks_expected:
            found.append(
                f"{where}: tasks max/mean {r.tasks_max_over_mean:.2f} over "
                f"{PLAN_MAX_TASKS_OVER_EXPECTED} x the expected {r.tasks_expected:.2f}"
            )
    return found


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| shards | vnodes | runtimes max/mean | tasks max/mean | hot runtime share "
        "| tasks expected | moved on +1 shard | 1/(N+1) | strays |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.shards} | {r.vnodes} | {r.runtimes_max_over_mean:.2f} "
            f"| {r.tasks_max_over_mean:.2f} | {r.hot_runtime_share:.1%} | {r.tasks_expected:.2f} "
            f"| {r.moved_fraction:.3f} | {r.expected_moved:.3f} | {r.strays} |"
        )
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.capacity_sim",
        description="Place runtimes with a Zipf task rate on N Postgres shards by consistent "
        "hashing with virtual nodes; print the load imbalance and the runtimes moved when a "
        "shard is added, as a Markdown table.",
    )
    parser.add_argument("--runtimes", type=int, default=DEFAULT_RUNTIMES, help="(10000)")
    parser.add_argument(
        "--zipf",
        type=float,
        default=DEFAULT_ZIPF_EXPONENT,
        help="Zipf exponent of task rates (1.0)",
    )
    parser.add_argument(
        "--shards", type=_int_list, default=list(DEFAULT_SHARDS), help="shard counts (2,...,16)"
    )
    parser.add_argument(
        "--vnodes",
        type=_int_list,
        default=list(DEFAULT_VNODES),
        help="vnodes per shard (1,16,64,256)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="shuffle seed (1)")
    args = parser.parse_args(argv)
    rates = zipf_rates(args.runtimes, args.zipf, args.seed)
    rows = simulate(rates, args.shards, args.vnodes)
    print(table(rows))
    planned = [r for r in rows if r.vnodes == PLAN_VNODES]
    for line in violations(planned):
        print(f"plan assumption broken: {line}", file=sys.stderr)
    return 1 if violations(planned) else 0


if __name__ == "__main__":
    sys.exit(main())
