"""Schedules: recurring tasks per runtime (docs/guides/schedules.md).

- plans.py: what a change or a tick decides, from the stored row and the clock;
- service.py: the scheduler, with the tick pass and the API's operations.

When a schedule ticks is gateway/timing.py's (below the wire format, which checks
definitions with it); the statements are store/schedules.py's.
"""
