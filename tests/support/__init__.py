"""The test suite's helpers, one copy of each, one concept per module:

- `ci`: skip a test whose server or tool is missing, or fail it under CI=true;
- `net`: free loopback ports;
- `waiting`: polling until a condition holds, with a deadline;
- `clocks`: a clock a test moves by hand;
- `databases`: databases made, migrated and dropped, and one-off queries on them;
- `stores`: the gateway's Store driven without HTTP, and requests parsed as routes do;
- `plans`: the EXPLAIN tests' realistic table and reading a statement's plan;
- `redis_keys`: Redis key prefixes of the tests' own, deleted at the session's end;
- `redis_servers`: private redis-server processes, a Cluster and a Sentinel;
- `pgbouncer`: a private PgBouncer in front of the test Postgres;
- `proxy`: a loopback TCP proxy that can blackhole (a dead link to Redis);
- `gateways`: gateways in this process, in a thread, or as `gateway serve` processes;
- `http`: requests to a running gateway and their answers;
- `connections`: raw TCP connections and hand-written requests;
- `lifecycle`: a task's life through the API (enqueue, claim, lease operations, lists);
- `credentials`: tokens, webhook secrets and signed deliveries;
- `openapi`: the OpenAPI document, its conformance checks and the fuzzing schema;
- `claims`: watching the claim path (its counters, parked polls, timed claims);
- `janitor`: driving the janitor and making rows look old;
- `metrics`: reading a gateway's Prometheus samples;
- `logs`: capturing the gateway's and uvicorn's log records;
- `browser`: a real Chromium for the console's tests;
- `fake_gateway`: an in-memory gateway for the client's worker tests;
- `asgi`: a minimal ASGI driver for the bench's floor apps.

This package holds no tests and no fixtures; fixtures live in the conftest.py files
(tests/conftest.py for the servers, databases and Redis, tests/e2e/conftest.py for
the per-module gateways, tests/integration/conftest.py for the store), and call these.
tests/unit/test_layering.py keeps helpers here and out of test modules and conftests.
"""
