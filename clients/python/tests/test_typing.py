"""The types hold users to the API: mypy refuses a misspelt keyword to the blocking
`Client` (whose methods once took `**fields: Any`, so that a typo reached the gateway
or was dropped), and accepts the same calls spelt right."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).resolve().parent / "typing_cases"
CLIENT = CASES.parents[1]
# aiohttp is typed and large: its types play no part in these calls, and skipping it
# keeps one mypy run within a few seconds.
CONFIG = """
[mypy]
strict = true
warn_unused_ignores = true

[mypy-aiohttp.*]
follow_imports = skip
"""


@pytest.mark.timeout(120)  # one mypy run, with a cold cache of its own
def test_mypy_refuses_a_misspelt_keyword_and_accepts_the_right_one(tmp_path: Path) -> None:
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--show-error-codes",
            "--no-error-summary",
            "--no-pretty",
            str(CASES / "misspelt.py"),
            str(CASES / "correct.py"),
        ],
        capture_output=True,
        text=True,
        cwd=CLIENT,
    )
    errors = [line for line in run.stdout.splitlines() if ": error: " in line]
    assert run.returncode == 1 and errors, run.stdout + run.stderr
    flagged: dict[tuple[str, int], list[str]] = {}
    for line in errors:
        match = re.match(r"(.+?):(\d+): error: (.*)$", line)
        assert match, line
        flagged.setdefault((Path(match[1]).name, int(match[2])), []).append(match[3])
    # Only the misspelt calls are flagged, each for its misspelt keyword (an overloaded
    # method adds that no overload matches).
    misspelt = (CASES / "misspelt.py").read_text().splitlines()
    expected = {
        ("misspelt.py", n): f'Unexpected keyword argument "{word}" for '
        for n, line in enumerate(misspelt, 1)
        for word in ("priorty", "wait_second")
        if f"{word}=" in line
    }
    assert set(flagged) == set(expected), run.stdout
    for where, text in expected.items():
        assert any(text in message for message in flagged[where]), (where, flagged[where])
