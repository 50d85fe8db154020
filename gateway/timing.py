"""When a schedule ticks: a cron expression in a time zone, or a fixed interval.

A cron has 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds
first (as Quartz and Spring write it); its fields are read by cronsim, with Vixie
cron's rule that a day-of-month and a day-of-week both restricted match either. It is
evaluated on the wall clock of its IANA `timezone`, and each wall-clock time becomes
one instant:
- a time that does not exist (the hour skipped when clocks spring forward) runs once,
  at the first instant after the gap: 02:30 on that day runs at 03:00, and several
  ticks inside the gap run once together;
- a time that happens twice (the hour repeated when clocks fall back) runs once, at
  its first occurrence; no tick falls in the repeated hour's second pass.

`every_seconds` ticks on multiples of the interval since the Unix epoch, in UTC (a
60 s schedule ticks on the minute whatever its zone).

Pure computation, no I/O: the API checks definitions with it, and the tick pass and
the schedule's answers compute ticks with it. All instants are aware datetimes in UTC.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import ValidationFailed

MAX_EVERY_SECONDS = 366 * 86400
MAX_TIMEZONE_CHARS = 64
MAX_CRON_CHARS = 200
# A cron whose first tick is further than this from now is taken to never fire: it
# names a date that does not exist (`0 0 30 2 *`), or one so rare it is a mistake.
NEVER_YEARS = 5
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


@functools.lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """The IANA zone `name`, or ValidationFailed naming `timezone`. zoneinfo finds the
    zones in the system's files or in the tzdata package (a dependency), so that it
    works where the system has none."""
    if not name or len(name) > MAX_TIMEZONE_CHARS or name.startswith(("/", ".")) or ".." in name:
        raise ValidationFailed(f"unknown time zone {name!r}", field="timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationFailed(
            f"unknown time zone {name!r}; give an IANA name such as Europe/Paris or UTC",
            field="timezone",
        ) from None


@dataclass(frozen=True)
class Timing:
    """A schedule's ticks: `cron` in `timezone`, or `every_seconds` (exactly one)."""

    cron: str | None
    every_seconds: int | None
    timezone: str = "UTC"

    @classmethod
    def checked(
        cls, cron: str | None, every_seconds: int | None, timezone: str, now: datetime
    ) -> Timing:
        """The timing, or ValidationFailed naming the field: a cron cronsim refuses, or
        one that would not fire within NEVER_YEARS of `now`; an unknown zone."""
        zone(timezone)
        if (cron is None) == (every_seconds is None):
            raise ValidationFailed("give cron or every_seconds, exactly one", field="cron")
        timing = cls(cron, every_seconds, timezone)
        if cron is not None:
            fields = cron.split()
            if len(fields) not in (5, 6):
                raise ValidationFailed(
                    f"cron must have 5 fields (minute hour day month weekday), or 6 with "
                    f"seconds first; {cron!r} has {len(fields)}",
                    field="cron",
                )
            try:
                first = timing.next_after(now)
            except CronSimError as exc:
                raise ValidationFailed(
                    f"cron {cron!r} cannot be read: {exc}", field="cron"
                ) from None
            if first is None or first > now + timedelta(days=366 * NEVER_YEARS):
                raise ValidationFailed(
                    f"cron {cron!r} never fires (no such date within {NEVER_YEARS} years)",
                    field="cron",
                )
        return timing

    def next_after(self, instant: datetime) -> datetime | None:
        """The first tick strictly after `instant`; None if there is none."""
        return next(self.ticks_after(instant), None)

    def ticks_after(self, instant: datetime) -> Iterator[datetime]:
        """The ticks strictly after `instant`, in order, without end (or until the
        cron's last: cronsim stops at the end of its calendar)."""
        if self.every_seconds is not None:
            step = self.every_seconds * 1_000_000
            since = (instant - _EPOCH) // timedelta(microseconds=1)
            n = since // step + 1
            while True:
                yield _EPOCH + timedelta(microseconds=n * step)
                n += 1
        assert self.cron is not None
        yield from _cron_ticks(self.cron, zone(self.timezone), instant)

    def ticks_between(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """The ticks in (after, until], at most `limit` of them."""
        out: list[datetime] = []
        for tick in self.ticks_after(after):
            if tick > until or len(out) >= limit:
                break
            out.append(tick)
        return out

    def upcoming(self, after: datetime, count: int) -> list[datetime]:
        out: list[datetime] = []
        for tick in self.ticks_after(after):
            out.append(tick)
            if len(out) >= count:
                break
        return out


def _cron_ticks(cron: str, tz: ZoneInfo, instant: datetime) -> Iterator[datetime]:
    """The cron's wall-clock times in `tz` after `instant`, each made an instant
    (`_instant`), without repeats and in order. Wall-clock times map to instants in
    order, so walking them from the wall-clock time of `instant` and dropping those not
    after it misses none."""
    local = instant.astimezone(tz).replace(tzinfo=None)
    last = instant
    for wall in CronSim(cron, local):
        tick = _instant(wall, tz)
        if tick > last:  # several wall times in a skipped hour become one instant
            last = tick
            yield tick


def _instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """A wall-clock time in `tz` as an instant in UTC: its first occurrence when it
    happens twice, the end of the gap when it does not exist."""
    if tz.key == "UTC":
        return wall.replace(tzinfo=UTC)
    first = wall.replace(tzinfo=tz, fold=0)
    if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall:
        return first.astimezone(UTC)
    # In a gap: fold=1 reads the wall time with the offset after the change, which
    # lands before the gap; fold=0 with the one before, after it. The change is the
    # instant between them where the offset turns (found to the second: zones change
    # on whole seconds).
    lo = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    hi = first.astimezone(UTC)
    before = lo.astimezone(tz).utcoffset()
    while hi - lo > _SECOND:
        mid = lo + (hi - lo) // 2
        mid -= timedelta(microseconds=mid.microsecond)
        if mid <= lo:
            break
        if mid.astimezone(tz).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi
