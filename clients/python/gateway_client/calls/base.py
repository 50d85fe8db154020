"""What every group of calls (calls/history.py, bulk.py, schedules.py) needs of
`AsyncClient`: its `request`, declared here once so that each group type-checks alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Calls:
    """A group of `AsyncClient`'s calls; the client (client.py) supplies `request`."""

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float | None = None,
    ) -> tuple[int, Any, Mapping[str, str]]:
        raise NotImplementedError
