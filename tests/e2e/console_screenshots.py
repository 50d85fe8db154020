"""Screenshots of the console for the README: `python -m tests.e2e.console_screenshots`.

Starts a `gateway serve` process on a database of its own (made on TEST_DATABASE_URL's
server, dropped afterwards) and TEST_REDIS_URL, fills it with a few example runtimes,
and saves docs/console/{runtimes,runtime,schedules,task,task-narrow,charts,
charts-narrow,failing,bulk-confirm}.png from Debian's Chromium.

The charts need a past: a day of history is written for the example runtimes straight
into the history's table, as the janitor's rollup leaves it (one row per runtime and
minute, its depth read), with an incident on ci-linux-x64 over the last 40 minutes.
Not run by the test suite."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import asyncpg

from gateway.store.history import WAIT_BOUNDS_SECONDS
from tests.support.browser import MISSING, Api, browser_page, chromium_missing
from tests.support.databases import temporary_database
from tests.support.gateways import TOKEN, serve_env, serve_process
from tests.support.redis_keys import new_prefix

OUT = Path(__file__).resolve().parents[2] / "docs" / "console"


async def _seed(api: Api) -> str:
    """Example runtimes; answers the id of the task to show."""
    for rt, queued, claimed in [
        ("ci-linux-x64", 14, 3),
        ("ci-macos-arm64", 4, 2),
        ("deploy-eu-west", 0, 1),
        ("agents.research", 27, 6),
        ("nightly-backups", 2, 0),
    ]:
        batch = [{"payload": {"job": f"{rt}-{i}", "attempt": 1}} for i in range(queued + claimed)]
        await api.ok("POST", f"/v1/runtimes/{rt}/tasks:batch", {"tasks": batch})
        if claimed:
            await api.ok(
                "POST", f"/v1/runtimes/{rt}/claim", {"worker_id": f"{rt}-w1", "max_tasks": claimed}
            )
    # A paused runtime, for the runtimes list's state column.
    await api.ok("POST", "/v1/runtimes/nightly-backups:pause")
    rt = "ci-linux-x64"
    done = await api.enqueue(rt, {"repo": "acme/web", "ref": "main", "cmd": ["make", "test"]})
    [task] = (
        await api.ok("POST", f"/v1/runtimes/{rt}/claim", {"worker_id": "runner-7", "max_tasks": 1})
    )["tasks"]
    await api.ok(
        "POST",
        f"/v1/tasks/{task['id']}/complete",
        {"lease_id": task["lease_id"], "result": {"exit_code": 0, "duration_seconds": 41.7}},
    )
    del done
    # Two tasks that ended dead, for the runtimes list's dead column.
    for n in range(2):
        await api.enqueue(rt, {"repo": "acme/legacy", "n": n})
        [doomed] = (await api.ok("POST", f"/v1/runtimes/{rt}/claim", {"worker_id": "runner-3"}))[
            "tasks"
        ]
        await api.ok(
            "POST",
            f"/v1/tasks/{doomed['id']}/fail",
            {"lease_id": doomed["lease_id"], "error": "exit code 2", "retry": False},
        )
    # The runtime page shows a pause's reason and end.
    until = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    await api.ok(
        "POST",
        f"/v1/runtimes/{rt}:pause",
        {"reason": "runner image upgrade in progress", "until": until},
    )
    # The runtime page's schedules panel: a cron in a zone, an interval, a paused one,
    # and one run now, so that its row links its last task.
    for name, definition in [
        ("nightly-full", {"cron": "0 3 * * *", "timezone": "Europe/Paris"}),
        ("flaky-retest", {"every_seconds": 900, "overlap": "buffer_one"}),
        ("weekly-deps", {"cron": "0 6 * * 1", "timezone": "America/New_York"}),
    ]:
        await api.ok(
            "PUT", f"/v1/runtimes/{rt}/schedules/{name}", {**definition, "payload": {"job": name}}
        )
    await api.ok("POST", f"/v1/runtimes/{rt}/schedules/nightly-full:trigger")
    await api.ok(
        "POST",
        f"/v1/runtimes/{rt}/schedules/weekly-deps:pause",
        {"note": "lockfile frozen until the 2.0 release"},
    )
    shown = await api.enqueue(
        rt,
        {
            "repo": "acme/api",
            "ref": "refs/pull/1182/head",
            "cmd": ["pytest", "-q", "tests/integration"],
            "env": {"PYTHON": "3.12", "SHARD": "2/4"},
            "budget_cents": 125000,
        },
        priority=80,
        max_attempts=3,
    )
    return str(shown["id"])


HISTORY_ROW = """
INSERT INTO task_history (runtime_id, at, backend, enqueued, claimed, completed, failed,
                          dead, waits, depth, oldest_queued_age_seconds)
SELECT $1, to_timestamp((floor(extract(epoch FROM now()) / 60) - $2) * 60), 0,
       $3, $4, $5, $6, $7, $8, $9, $10
"""
# The example rows of the runtimes $1 added to the rollups of migration 0017, as the
# fold and the depth read add what they write: the runtimes page's fleet chart and the
# failing view read those.
_EXAMPLE = "FROM task_history WHERE backend = 0 AND runtime_id = ANY ($1::text[])"
_WAITS = ", ".join(f"sum(waits[{i}])" for i in range(1, len(WAIT_BOUNDS_SECONDS) + 2))
HISTORY_ROLLUPS = (
    f"""
INSERT INTO task_history_fleet AS f (at, enqueued, claimed, completed, failed, dead, waits,
                                     depth, oldest_queued_age_seconds)
SELECT at, sum(enqueued), sum(claimed), sum(completed), sum(failed), sum(dead),
       ARRAY[{_WAITS}]::bigint[], sum(depth), max(oldest_queued_age_seconds)
{_EXAMPLE} GROUP BY at
ON CONFLICT (at) DO UPDATE SET
    enqueued = f.enqueued + EXCLUDED.enqueued, claimed = f.claimed + EXCLUDED.claimed,
    completed = f.completed + EXCLUDED.completed, failed = f.failed + EXCLUDED.failed,
    dead = f.dead + EXCLUDED.dead, waits = history_waits_add(f.waits, EXCLUDED.waits),
    depth = coalesce(f.depth, 0) + EXCLUDED.depth,
    oldest_queued_age_seconds =
        greatest(f.oldest_queued_age_seconds, EXCLUDED.oldest_queued_age_seconds)
""",
    f"""
INSERT INTO task_history_failures AS f (runtime_id, hour, failed, dead)
SELECT runtime_id, history_hour(at), sum(failed), sum(dead)
{_EXAMPLE} AND failed + dead > 0 GROUP BY runtime_id, history_hour(at)
ON CONFLICT (runtime_id, hour) DO UPDATE SET
    failed = f.failed + EXCLUDED.failed, dead = f.dead + EXCLUDED.dead
""",
    f"""
INSERT INTO task_history_runtimes AS r (runtime_id, last_at, depth_at, depth)
SELECT DISTINCT ON (runtime_id) runtime_id, at, at, depth
{_EXAMPLE} ORDER BY runtime_id, at DESC
ON CONFLICT (runtime_id) DO UPDATE SET
    last_at = greatest(r.last_at, EXCLUDED.last_at),
    depth_at = greatest(r.depth_at, EXCLUDED.depth_at),
    depth = CASE WHEN r.depth_at >= EXCLUDED.depth_at THEN r.depth ELSE EXCLUDED.depth END
""",
)


def _waits(claims: int, typical: float, rng: random.Random) -> list[int]:
    """`claims` first-claim waits around `typical` seconds, counted into the wait buckets."""
    waits = [0] * (len(WAIT_BOUNDS_SECONDS) + 1)
    for _ in range(claims):
        wait = typical * rng.lognormvariate(0, 0.8)
        waits[sum(1 for bound in WAIT_BOUNDS_SECONDS if wait >= bound)] += 1
    return waits


async def _history(url: str) -> None:
    """A day of per-minute history for the example runtimes, the current minute left to
    the gateway's own counts. ci-linux-x64's builds start failing 40 minutes ago: failures
    and deaths rise, completions fall, and the queue and its oldest task grow."""
    rng = random.Random(7)
    rows = []
    profiles = {  # runtime: (tasks per minute at the day's peak, minutes with activity)
        "ci-linux-x64": (24, 1),
        "ci-macos-arm64": (6, 2),
        "agents.research": (12, 1),
        "deploy-eu-west": (1, 20),
        "nightly-backups": (2, 60),
    }
    for rt, (peak, every) in profiles.items():
        depth = 4
        for ago in range(24 * 60, 0, -1):
            if ago % every:
                continue
            daily = 0.55 + 0.45 * math.sin(ago / (24 * 60) * 2 * math.pi + 1.3)
            enqueued = max(0, round(rng.gauss(peak * daily, peak * 0.15)))
            failed = dead = 0
            completed = enqueued
            age = rng.uniform(2, 20)
            if rt == "ci-linux-x64" and ago <= 40:
                dead = rng.randint(3, 8)
                failed = rng.randint(6, 12)
                completed = max(0, enqueued - dead - failed - rng.randint(4, 9))
                # Up to the 16 the example leaves queued, now.
                depth = 3 + round((41 - ago) / 40 * 13)
                age = (41 - ago) * 60 * 0.8
            elif rt == "agents.research" and 300 <= ago <= 330:
                failed = rng.randint(1, 3)
            else:
                depth = max(0, depth + rng.randint(-1, 1))
            claimed = completed + failed + dead
            typical = 0.3 if age < 60 else 40.0
            rows.append(
                (
                    rt,
                    ago,
                    enqueued,
                    claimed,
                    completed,
                    failed,
                    dead,
                    _waits(claimed, typical, rng),
                    depth,
                    age if depth else None,
                )
            )
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.executemany(HISTORY_ROW, rows)
            for statement in HISTORY_ROLLUPS:
                await conn.execute(statement, list(profiles))
    finally:
        await conn.close()


async def _failures(api: Api) -> None:
    """Dead tasks with a few kinds of error, for the failing view's groups."""
    for rt, errors in [
        (
            "ci-linux-x64",
            ["TimeoutError: the build took longer than 3600 s"] * 5
            + ["OSError: [Errno 28] No space left on device\n  at /var/lib/runner"] * 3
            + ["AssertionError: expected <200>, got <502>"],
        ),
        ("agents.research", ["RateLimitError: 429 from the model provider"] * 2),
    ]:
        for error in errors:
            await api.enqueue(rt, {"repo": "acme/web", "shard": 3})
            [doomed] = (await api.ok("POST", f"/v1/runtimes/{rt}/claim", {"worker_id": "r-9"}))[
                "tasks"
            ]
            await api.ok(
                "POST",
                f"/v1/tasks/{doomed['id']}/fail",
                {"lease_id": doomed["lease_id"], "error": error, "retry": False},
            )


async def main() -> int:
    if chromium_missing():
        print(MISSING, file=sys.stderr)
        return 1
    admin_url = os.environ.get("TEST_DATABASE_URL")
    redis_url = os.environ.get("TEST_REDIS_URL")
    if not admin_url or not redis_url:
        print("set TEST_DATABASE_URL and TEST_REDIS_URL (see README, Development)", file=sys.stderr)
        return 2
    async with temporary_database(admin_url) as url:
        env = serve_env(url, redis_url, new_prefix())
        async with serve_process(env=env) as (proc, base), aiohttp.ClientSession() as http:
            api = Api(http, base, TOKEN)
            await _failures(api)
            task_id = await _seed(api)
            await _history(url)
            # Two daemons waiting on a runtime with nothing queued: parked pollers.
            parked = [
                asyncio.create_task(
                    api.call(
                        "POST",
                        "/v1/runtimes/deploy-eu-west/claim",
                        {"worker_id": f"deployer-{i}", "wait_seconds": 30},
                    )
                )
                for i in range(2)
            ]
            await asyncio.sleep(0.5)
            token = await api.make_token(["read", "enqueue"])
            OUT.mkdir(parents=True, exist_ok=True)
            async with browser_page(1100, 640) as page:
                await page.goto(f"{base}/console#token={token}")
                await page.locator("#runtimes .sparkline path").first.wait_for()
                await page.locator("#fleet-chart path").first.wait_for()
                await page.screenshot(path=OUT / "runtimes.png", full_page=True)
                await page.goto(f"{base}/console#/failing")
                await page.locator(".failing-runtime .groups").first.wait_for()
                await page.screenshot(path=OUT / "failing.png", full_page=True)
                first = page.locator(".failing-runtime").first
                await first.get_by_role("button", name="Retry these 5").click()
                await first.screenshot(path=OUT / "bulk-confirm.png")
                await page.goto(f"{base}/console#/runtime/ci-linux-x64")
                await page.locator("#tasks").wait_for()
                await page.locator("#wait-chart path").first.wait_for()
                await page.screenshot(path=OUT / "runtime.png", full_page=True)
                # The throughput chart read by keyboard: a column 12 minutes ago.
                chart = page.locator("#throughput-chart svg[role=img]")
                await chart.focus()
                await page.keyboard.press("End")
                for _ in range(12):
                    await page.keyboard.press("ArrowLeft")
                await page.locator(".history").screenshot(path=OUT / "charts.png")
                await page.locator("#schedules details").first.locator("summary").click()
                panel = page.locator(".schedules")
                await panel.screenshot(path=OUT / "schedules.png")
                table = page.locator(".schedules .scroll")
                if await table.evaluate("e => e.scrollWidth > e.clientWidth"):
                    print("the schedules table scrolls sideways at 1,100 pixels", file=sys.stderr)
                await page.goto(f"{base}/console#/task/{task_id}")
                await page.locator("pre").wait_for()
                await page.screenshot(path=OUT / "task.png", full_page=True)
                await page.set_viewport_size({"width": 400, "height": 800})
                await page.screenshot(path=OUT / "task-narrow.png", full_page=True)
                await page.goto(f"{base}/console#/runtime/ci-linux-x64")
                await page.locator("#wait-chart path").first.wait_for()
                await page.locator(".history").screenshot(path=OUT / "charts-narrow.png")
            for poll in parked:
                poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*parked)
            proc.terminate()
            await proc.wait()
    print(f"saved {', '.join(sorted(p.name for p in OUT.glob('*.png')))} in docs/console/")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
