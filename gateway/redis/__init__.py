"""Everything the gateway keeps in Redis, and the clients that reach it.

Redis only ever saves work (design section 3): a claim reads the empty verdict there
before Postgres, bumps and wake-ups tell waiting polls that work arrived, and the
parked-count hash shares each instance's waiting polls. Every call has a short budget,
a circuit breaker skips Redis after repeated errors, and a failure is a miss (I5).

- keys.py: the keys and channels of a runtime;
- verdict.py: the versioned empty verdict, bumps and wake-up publishes (VerdictCache);
- breaker.py: the circuit breaker every call goes through;
- clients.py: one place that builds the client of every mode (standalone, cluster,
  sentinel), with the gateway's budgets;
- slots.py: the bound on calls in flight per process;
- wakeups.py: the pub/sub subscriber that wakes parked polls;
- parked.py: the parked-poll counts each instance reports.
"""
