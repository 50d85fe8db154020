"""A clock a test moves by hand, for code that takes its clock as an argument (a
callable returning seconds, like time.monotonic)."""

from __future__ import annotations


class FakeClock:
    """Reads `now`; the test sets it, adds to it, or calls advance()."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
