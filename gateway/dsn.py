"""The hosts a Postgres URL names, read as the driver reads them: for the settings'
checks (gateway/settings.py) and for the connections that walk them host by host
(gateway/store/hosts.py), so that both count the same hosts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

DEFAULT_PORT = 5432
_IPV6 = re.compile(r"\[([^\]]+)\](?::([0-9]+))?$")


@dataclass(frozen=True)
class Host:
    """One server of a URL: a host name or address and its port, or a socket directory
    (a path) with the port that names the socket in it."""

    host: str
    port: int

    def __str__(self) -> str:
        if self.host.startswith("/"):
            return f"the socket in {self.host} (port {self.port})"
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def _ports(text: str | None, count: int) -> list[int | None]:
    """The ports a `port` parameter (or PGPORT) gives `count` hosts: one for all, or one
    each; None where it gives none."""
    if not text:
        return [None] * count
    ports: list[int | None] = [int(p) for p in text.split(",")]
    if len(ports) == 1:
        return ports * count
    return [*ports, *([None] * count)][:count]


def hosts(dsn: str) -> list[Host]:
    """The hosts a `postgresql://` URL names, in its order, as the driver reads them:
    the URL's host part (`h1:5432,h2:5433`, `[::1]:5432`), else its `host` parameter
    (with `port`); a host without a port takes PGPORT, else 5432. Empty when the URL
    names none (the driver then falls back to PGHOST or its defaults)."""
    parts = urlsplit(dsn)
    netloc = parts.netloc.partition("@")[2] if "@" in parts.netloc else parts.netloc
    query = dict(parse_qsl(parts.query))
    if netloc:
        specs = [unquote(s) for s in netloc.split(",")]
        defaults = _ports(os.environ.get("PGPORT"), len(specs))
    elif query.get("host"):
        specs = query["host"].split(",")
        defaults = _ports(query.get("port") or os.environ.get("PGPORT"), len(specs))
    else:
        return []
    listed = []
    for spec, default in zip(specs, defaults, strict=True):
        if spec.startswith("/"):
            name, port = spec, ""
        elif match := _IPV6.match(spec):
            name, port = match.group(1), match.group(2) or ""
        else:
            name, _, port = spec.partition(":")
        listed.append(Host(name, int(port) if port else default or DEFAULT_PORT))
    return listed
