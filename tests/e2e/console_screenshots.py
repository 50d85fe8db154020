"""Screenshots of the console for the README: `python -m tests.e2e.console_screenshots`.

Starts a `gateway serve` process on a database of its own (made on TEST_DATABASE_URL's
server, dropped afterwards) and TEST_REDIS_URL, fills it with a few example runtimes,
and saves docs/console/{runtimes,runtime,schedules,task,task-narrow}.png from Debian's
Chromium.
Not run by the test suite."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

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
            task_id = await _seed(api)
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
                await page.locator("#runtimes").wait_for()
                await page.screenshot(path=OUT / "runtimes.png", full_page=True)
                await page.goto(f"{base}/console#/runtime/ci-linux-x64")
                await page.locator("#tasks").wait_for()
                await page.screenshot(path=OUT / "runtime.png", full_page=True)
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
