"""Schemathesis's own run over the whole API, as its command line runs it: every check
(`--checks all`: besides conformance of the answers, that invalid data is refused and
valid data accepted, that an undocumented method is 405 with an Allow header, that
authentication is not ignored) and every phase: the document's examples, coverage of
each schema's edges and each method, random fuzzing, and the stateful phase, which
follows the document's links (enqueue, then get or cancel the task; claim, then
complete, fail, heartbeat or release it).

`make test` runs it briefly from a fixed seed (FUZZ_EXAMPLES per operation, about 30 s);
`make fuzz` runs it for FUZZ_SECONDS from a random seed (FUZZ_SEED replays one). Refusals
of valid data that JSON Schema cannot describe are listed, with their reasons, in
tests/e2e/schemathesis_hooks.py.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gateways import gateway_thread
from tests.support.openapi import AUTH, OVERRIDES
from tests.support.redis_keys import new_prefix

ROOT = Path(__file__).resolve().parents[2]
SECONDS = int(os.environ.get("FUZZ_SECONDS", "0"))  # 0: one pass, FUZZ_EXAMPLES each
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10"))
SEED = int(os.environ.get("FUZZ_SEED") or (random.randrange(2**31) if SECONDS else 20260601))


@pytest.mark.slow
# One pass took 90 s, and over 200 s on a slow machine beside the suite's workers.
@pytest.mark.timeout(SECONDS + 540)
def test_schemathesis_finds_no_disagreement(database_url: str, redis_url: str, tmp_path: Path):
    with gateway_thread(
        database_url=database_url, redis_url=redis_url, prefix=new_prefix(), **OVERRIDES
    ) as served:
        args = [
            *(sys.executable, "-m", "schemathesis.cli", "run", served.url + "/openapi.json"),
            *("--checks", "all", "--phases", "examples,coverage,fuzzing,stateful"),
            *("--seed", str(SEED), "--workers", "1", "--request-timeout", "30"),
            *("--header", f"Authorization: {AUTH['Authorization']}"),
            *(("--max-time", str(SECONDS)) if SECONDS else ("--max-examples", str(EXAMPLES))),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
            "NO_COLOR": "1",
        }
        # Run in a directory of its own: schemathesis keeps a cache where it runs.
        done = subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=SECONDS + 500
        )
    report = done.stdout + done.stderr
    assert done.returncode == 0, f"schemathesis failed (seed {SEED}):\n{report}"
