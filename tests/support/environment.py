"""An environment mapping that notes every name read from it: the settings tests hold
`Settings.from_env` to the declared variables with it."""

from __future__ import annotations

from typing import Any


class RecordingEnv(dict[str, str]):
    """A dict of environment variables that records, in `read`, every name asked for."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env)
        self.read: set[str] = set()

    def get(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        return super().get(name, default)

    def __getitem__(self, name: str) -> str:
        self.read.add(name)
        return super().__getitem__(name)
