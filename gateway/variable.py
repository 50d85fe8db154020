"""One environment variable's declaration (`Variable`), and how its text becomes its
value: the readers of each kind, which refuse a value out of range with a ConfigError
that names the variable. gateway/environment/ declares every variable with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .errors import ConfigError

# How a variable's text becomes its value, by the reader of each kind (Variable.read):
# "optional" is text or None when unset or empty; "text" keeps an empty value (a check
# then refuses it); "lowered" is text folded to lower case, checked in validate(); the
# others take the default when unset or empty and refuse a value out of range.
Kind = Literal["optional", "text", "lowered", "switch", "choice", "number", "integer"]


@dataclass(frozen=True)
class Variable:
    """One environment variable, declared once: its name, the Settings field it sets, how
    its text is read (kind, default, bounds or choices, unit) and what it means, in the
    paragraph the configuration reference shows."""

    name: str
    field: str
    kind: Kind
    default: str | float | bool | None
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    unit: str = ""
    # What the reference shows as the default where the value alone would say too little.
    shown_default: str = ""

    def read(self, env: Mapping[str, str]) -> object:
        """This variable's value in env; raises ConfigError naming it."""
        if self.kind == "optional":
            return env.get(self.name) or None
        if self.kind == "text":
            return env.get(self.name, str(self.default))
        if self.kind == "lowered":
            return (env.get(self.name) or str(self.default)).strip().lower()
        if self.kind == "switch":
            return _switch(env, self.name, bool(self.default))
        if self.kind == "choice":
            return _choice(env, self.name, self.choices, str(self.default))
        if self.low is None or self.high is None or not isinstance(self.default, int | float):
            raise AssertionError(f"{self.name}: a number needs a numeric default and bounds")
        if self.kind == "number":
            return _number(env, self.name, self.default, self.low, self.high)
        return _integer(env, self.name, int(self.default), int(self.low), int(self.high))


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise ConfigError(f"{name} must be 'on' or 'off', got {raw!r}")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {raw!r}")
    return value


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low:g} and {high:g}, got {raw!r}")
    return value


def _integer(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = _number(env, name, default, low, high)
    if value != int(value):
        raise ConfigError(f"{name} must be a whole number, got {env.get(name)!r}")
    return int(value)
