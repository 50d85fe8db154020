"""The bounds and choices the environment variables' declarations share with the checks
of gateway/settings.py: what a token, a log format, a JSON depth or a Redis mode may be.
"""

from __future__ import annotations

MIN_ADMIN_TOKEN_CHARS = 32
LOG_FORMATS = ("text", "json")
SWITCH = ("on", "off")  # what the reference shows; true/false, 1/0 and yes/no are read too
MAX_JSON_DEPTH_LIMIT = 200
REDIS_MODES = ("standalone", "cluster", "sentinel")
# Connections of one process's command client (per node in a cluster). A call on the
# claim path holds one for well under a millisecond, so 64 serve tens of thousands of
# calls a second, four times the default GATEWAY_MAX_CONCURRENT_CLAIMS; and 150
# processes, each with its pub/sub connection, stay under Redis's default maxclients
# (10,000). A call beyond the bound waits for a connection (gateway/redis/slots.py).
DEFAULT_REDIS_MAX_CONNECTIONS = 64
MAX_REDIS_MAX_CONNECTIONS = 10_000  # Redis's default maxclients: more could never open
