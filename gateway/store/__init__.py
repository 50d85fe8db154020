"""Task storage in Postgres: `Store`, every group of statements over one pool.

Each group is a module of this package, on the pool and its plumbing (base.py, where
asyncpg and socket errors become StoreUnavailable: nothing above the store sees a
driver exception):

- tasks.py: enqueue, batch enqueue, and a task's statements without a lease;
- leases.py: the claim and one task's lease operations;
- acks.py: batch lease operations;
- janitor.py: the janitor's statements and its leadership lock;
- controls.py: runtime controls and the claim of a runtime with limits.

The runtimes listing reads through functions over a Store (runtimes.py). Each module's
SQL is in the module of sql/ named after it (sql/tasks.py for tasks.py), the pieces
several share in sql/fragments.py; the schema's migrations are applied by migrate.py.
The rows they return are gateway/rows.py's, which the layers above share.
"""

from __future__ import annotations

from .acks import BatchAckStatements
from .controls import ControlStatements
from .janitor import JanitorStatements


class Store(ControlStatements, BatchAckStatements, JanitorStatements):
    """Task storage in Postgres. `open()` and `close()` are called by the app's lifespan."""
