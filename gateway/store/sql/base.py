"""The statements of store/base.py, which every transaction the gateway opens is made of:
its BEGIN (with the statement timeout), COMMIT and ROLLBACK.
"""

from __future__ import annotations

# Every transaction the gateway opens starts with this, one simple query: the statement
# timeout holds for this transaction only and costs no round trip of its own. A startup
# parameter is refused by PgBouncer, and a session SET would stay on a server
# connection that a transaction pooler shares with other clients.
BEGIN_WITH_TIMEOUT = "BEGIN; SET LOCAL statement_timeout = {timeout_ms:d}"

COMMIT = "COMMIT"

ROLLBACK = "ROLLBACK"
