"""The worker loop's options, `WorkerOptions`: how many handlers run at once, how long
a lease is, how a claim waits, how long running handlers get after stop(), and how
reports are sent. Times are in seconds.

The caller builds one and hands it to `Worker`, which reads it and never changes it;
a value the loop cannot work with is refused here, as the object is made, with a
ValueError naming the option.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

# The longest a finished task's completion waits for others to share its request; at
# most a sixth of the lease, whatever the option says (see WorkerOptions).
COMPLETE_WINDOW_SECONDS = 0.05


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class WorkerOptions:
    """`concurrency` handlers at once; leases of `lease_seconds`; long polls of
    `wait_seconds`; `grace_seconds` for running handlers after stop()."""

    concurrency: int = 1
    lease_seconds: int = 60
    max_tasks_per_poll: int = 10
    wait_seconds: float = 20.0  # long poll; the gateway's cap is GATEWAY_MAX_WAIT_SECONDS
    grace_seconds: float = 30.0
    worker_id: str = field(default_factory=default_worker_id)
    # With concurrency > 1: how long a completion may wait to share a request.
    complete_window_seconds: float = COMPLETE_WINDOW_SECONDS
    # Send a finished task's report with the next claim when that claim goes out at
    # once (one request instead of two); False: always on its own.
    reports_with_claims: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_tasks_per_poll < 1 or self.lease_seconds < 1:
            raise ValueError("concurrency, max_tasks_per_poll and lease_seconds must be >= 1")
        if self.complete_window_seconds < 0:
            raise ValueError("complete_window_seconds must be >= 0")
