"""Task storage in Postgres: `Store`, every group of statements over one pool.

Each group is a module of its own, on the pool and its plumbing (store_base.py, where
asyncpg and socket errors become StoreUnavailable: nothing above the store modules
sees a driver exception):

- store_tasks.py: enqueue, batch enqueue, and a task's statements without a lease;
- store_leases.py: the claim and one task's lease operations;
- store_acks.py: batch lease operations;
- store_janitor.py: the janitor's statements and its leadership lock;
- store_controls.py: runtime controls and the claim of a runtime with limits.

The runtimes listing reads through functions over a Store (store_runtimes.py). The
SQL of all of them is in queries.py.
"""

from __future__ import annotations

from .store_acks import BatchAckStatements
from .store_controls import ControlStatements
from .store_janitor import JanitorStatements


class Store(ControlStatements, BatchAckStatements, JanitorStatements):
    """Task storage in Postgres. `open()` and `close()` are called by the app's lifespan."""
