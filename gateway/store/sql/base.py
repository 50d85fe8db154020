"""The statements of store/base.py: what every transaction the gateway opens is made of
(its BEGIN with the statement timeout, COMMIT and ROLLBACK), and the one setting a
pooled connection takes when it keeps its prepared statements.
"""

from __future__ import annotations

# Every transaction the gateway opens starts with this, one simple query: the statement
# timeout holds for this transaction only and costs no round trip of its own. A startup
# parameter is refused by PgBouncer, and a session SET would stay on a server
# connection that a transaction pooler shares with other clients.
BEGIN_WITH_TIMEOUT = "BEGIN; SET LOCAL statement_timeout = {timeout_ms:d}"

COMMIT = "COMMIT"

ROLLBACK = "ROLLBACK"

# Sent once on each new pooled connection when asyncpg keeps prepared statements
# (GATEWAY_DB_STATEMENT_CACHE_SIZE > 0, connected to Postgres directly): each prepared
# statement then runs its generic plan, planned once per connection. Left to itself
# (plan_cache_mode = auto), Postgres planned the claim afresh on every execution once the
# table had statistics: the generic plan's estimate for `LIMIT $4` is a tenth of the
# runtime's queued rows, which a custom plan always beats on paper. The planning cost
# more than the claim: 1.1 ms of a 1.9 ms claim carrying one complete, and 0.6 ms of 1.4
# ms for a claim of ten (bench/README.md, "Plans kept"). Every statement's generic plan
# is held to its index by the EXPLAIN tests (tests/support/plans.py judges both modes).
# Behind a transaction pooler the cache is off and this is not sent: asyncpg's unnamed
# statements are planned once each whatever the mode, and a session SET would stay on a
# server connection that the pooler shares with other clients.
KEEP_GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
