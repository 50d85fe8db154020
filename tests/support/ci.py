"""What a test does when something it needs is missing: it skips, except under
`CI=true`, where every test must run and a missing server or tool fails it instead."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str, ci_hint: str = "") -> NoReturn:
    """Skip the test because of `reason`; under CI=true fail it (`ci_hint`: how CI gets
    what is missing)."""
    if IN_CI:
        hint = f" ({ci_hint})" if ci_hint else ""
        pytest.fail(f"{reason}, and CI=true forbids skipping{hint}", pytrace=False)
    pytest.skip(reason)
