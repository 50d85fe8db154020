"""A runtime's keys and channels in Redis, hash-tagged so that one runtime's keys share a
cluster slot: `<prefix>:{<rt>}:version`, `:empty`, `:wake` (its wake-up channel) and
`:parked` (the parked-poll hash)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass


def new_epoch() -> str:
    """A random epoch token: 64 bits, so two epochs never collide in practice."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Keys:
    version: str
    empty: str
    wake: str


def keys_for(prefix: str, runtime_id: str) -> Keys:
    base = f"{prefix}:{{{runtime_id}}}"
    return Keys(version=f"{base}:version", empty=f"{base}:empty", wake=f"{base}:wake")


# The suffix of an instance's field for tasks it handed out in the last minute, in the
# runtime's parked hash (gateway/redis/parked.py, gateway/claim/activity.py).
CLAIMS_FIELD = "/claims"


def parked_key(prefix: str, runtime_id: str) -> str:
    """The hash of the runtime's parked claims per instance (gateway/redis/parked.py), in the
    runtime's cluster slot."""
    return f"{prefix}:{{{runtime_id}}}:parked"


def runtime_of_channel(prefix: str, channel: str) -> str | None:
    head, tail = f"{prefix}:{{", "}:wake"
    if channel.startswith(head) and channel.endswith(tail):
        return channel[len(head) : -len(tail)]
    return None
