"""Where a call goes: the URL path of each endpoint, with the ids put into it (runtime
ids, task ids) quoted so that each reaches the gateway as one path segment, whatever
characters it holds."""

from __future__ import annotations

from urllib.parse import quote

from .errors import ValidationFailed

# Segments that no URL can carry as themselves: `.` and `..` are resolved away by URL
# libraries and proxies, and a `/`, even quoted as %2F, is decoded by servers (this
# gateway's included) before routing, so it would split the id in two.
_UNADDRESSABLE = ("", ".", "..")


def segment(field: str, value: str) -> str:
    """`value` quoted as one path segment (every character but letters, digits and
    `-._~`); ValidationFailed naming `field` for a value that no URL path can carry."""
    if value in _UNADDRESSABLE or "/" in value:
        detail = f"{field} {value!r} cannot be sent in a URL path: " + (
            "it is empty" if not value else "it holds '/'" if "/" in value else "it is a dot"
        )
        raise ValidationFailed(
            detail, problem={"code": ValidationFailed.code, "detail": detail, "field": field}
        )
    return quote(value, safe="")


def runtime_path(runtime: str, rest: str = "") -> str:
    """`/v1/runtimes/{runtime}` and `rest` (`/tasks`, `:pause`, ...)."""
    return f"/v1/runtimes/{segment('runtime_id', runtime)}{rest}"


def task_path(task_id: str, rest: str = "") -> str:
    """`/v1/tasks/{task_id}` and `rest` (`/cancel`, `/heartbeat`, ...)."""
    return f"/v1/tasks/{segment('task_id', task_id)}{rest}"
