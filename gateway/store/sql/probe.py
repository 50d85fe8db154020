"""The statements of store/probe.py: what `gateway doctor` asks Postgres."""

from __future__ import annotations

PROBE_SERVER_VERSION = "SHOW server_version"

PROBE_BACKEND_PID = "SELECT pg_backend_pid()"

# The client's address and port as the server sees them: a direct TCP connection shows
# the port this process opened; a pooler or proxy in between shows its own.
PROBE_CLIENT_PORT = "SELECT client_port FROM pg_stat_activity WHERE pid = pg_backend_pid()"

# clock_timestamp(), not now(): now() is the transaction's start.
PROBE_CLOCK = "SELECT extract(epoch FROM clock_timestamp())::float8"
