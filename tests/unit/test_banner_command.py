"""The serve banner's worker line names a `gateway` the user can run: after `make run`
the venv is not on the PATH, so it names `.venv/bin/gateway` instead."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gateway.cli.main import _command


def _program(folder: Path) -> Path:
    program = folder / "gateway"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return program


def test_a_gateway_off_the_path_is_named_by_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    program = _program(tmp_path / ".venv" / "bin")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(program), "serve"])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _command() == os.path.join(".venv", "bin", "gateway")


def test_the_gateway_the_shell_finds_is_named_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = _program(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(program), "serve"])
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _command() == "gateway"
