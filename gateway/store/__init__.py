"""Task storage in Postgres: `Store`, every group of statements over one pool.

Each group is a class of statements in a module of this package, on the pool and its
plumbing (base.py, where asyncpg and socket errors become StoreUnavailable: nothing
above the store sees a driver exception), and `Store` is all of them in one object:

- tasks.py: enqueue, batch enqueue, and a task's statements without a lease;
- bulk.py: a runtime's tasks retried or cancelled in bulk, and its error groups;
- leases.py: the claim and one task's lease operations;
- acks.py: batch lease operations;
- janitor.py: the janitor's statements and its leadership lock;
- controls.py: runtime controls and the claim of a runtime with limits;
- runtimes.py: the runtimes listing's reads;
- history.py: the per-runtime history's rollup and reads;
- schedules.py: schedules, and the transactions that decide their ticks;
- credentials.py: API tokens and webhook signing secrets.

A group's SQL is in the module of sql/ named after it (sql/tasks.py for tasks.py), the
pieces several share in sql/fragments.py; the schema's migrations are applied by
migrate.py. The rows they return are gateway/rows.py's, which the layers above share.
A new group is a class on StoreBase (or on the group it builds on) with its statements
in sql/, added to `Store` here.
"""

from __future__ import annotations

from .acks import BatchAckStatements
from .bulk import BulkStatements
from .controls import ControlStatements
from .credentials import CredentialStatements
from .history import HistoryStatements
from .janitor import JanitorStatements
from .leases import LeaseStatements
from .runtimes import RuntimeListStatements
from .schedules import ScheduleStatements
from .tasks import TaskStatements


class Store(
    ControlStatements,
    LeaseStatements,
    TaskStatements,
    BulkStatements,
    BatchAckStatements,
    JanitorStatements,
    RuntimeListStatements,
    HistoryStatements,
    CredentialStatements,
    ScheduleStatements,
):
    """Task storage in Postgres. `open()` and `close()` are called by the app's lifespan."""
