"""An id is quoted as one path segment, whatever it holds, or refused before any
request when no URL path can carry it (a real gateway: tests/e2e/test_client_paths.py)."""

from __future__ import annotations

import pytest

from gateway_client import ValidationFailed
from gateway_client.paths import runtime_path, segment, task_path


@pytest.mark.parametrize(
    ("raw", "sent"),
    [
        ("demo", "demo"),
        ("a?b", "a%3Fb"),
        ("a#b", "a%23b"),
        ("a%b", "a%25b"),
        ("a b", "a%20b"),
        ("a%2Fb", "a%252Fb"),
        ("a:b", "a%3Ab"),
        ("é", "%C3%A9"),
    ],
)
def test_an_id_is_quoted_as_one_segment(raw: str, sent: str) -> None:
    assert segment("runtime_id", raw) == sent
    assert runtime_path(raw, ":pause") == f"/v1/runtimes/{sent}:pause"
    assert task_path(raw, "/cancel") == f"/v1/tasks/{sent}/cancel"


@pytest.mark.parametrize("raw", ["", ".", "..", "a/b", "/", "../x"])
def test_an_id_no_url_path_can_carry_is_refused(raw: str) -> None:
    with pytest.raises(ValidationFailed, match="cannot be sent in a URL path") as refused:
        runtime_path(raw)
    assert refused.value.field == "runtime_id" and refused.value.status is None
