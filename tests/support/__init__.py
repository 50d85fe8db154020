"""Helpers shared across the test packages, one copy of each, by concept:

- `net`: free loopback ports;
- `waiting`: polling until a condition holds, with a deadline;
- `clocks`: a clock a test moves by hand;
- `http`: requests to a running gateway and their answers;
- `databases`: migrating a database and one-off queries on it;
- `metrics`: reading a gateway's Prometheus samples;
- `fake_gateway`: an in-memory gateway for the client's worker tests;
- `asgi`: a minimal ASGI driver for the bench's floor apps.

This package holds no tests and no fixtures; fixtures live in the conftest.py files.
"""
