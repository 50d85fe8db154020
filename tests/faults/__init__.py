"""The fault matrix against real servers: steady load over two gateway processes, one
fault per row (injected, healed), then every task checked against Postgres.

`checker` is the pure classification, `servers` the private Postgres and gateway
processes, `rig` one row's set of them with a private redis-server and, in front of it,
a loopback TCP proxy that can blackhole (both in tests/support), `load` the producers
and workers that record what they saw, `faults` the rows, `matrix` the run and its
table. `python -m tests.faults` (`make faults`) runs
every row; `soak` (`make soak`) runs the same rig, load and checker for minutes.
"""
