"""The claim path (docs/design.md section 3): parked polls, their per-runtime pump and
the near-cache, the waits for a task's result, grouped completes, runtime controls and
the activity kept for the runtimes listing. `ports.py` names what it needs of Postgres,
Redis and pub/sub."""
