"""Every SQL statement the gateway runs, by name, in a module named after the store
module that runs it: sql/tasks.py holds the statements of store/tasks.py, and so on for
leases, acks, janitor, controls, runtimes, credentials, base and migrate. The pieces
that the statements of several modules are built from are in fragments.py. No SQL lives
outside this package.

Hot-path statements (leases.CLAIM, leases.NEXT_DUE) have EXPLAIN tests that pin their
index.
"""
