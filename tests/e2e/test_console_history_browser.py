"""The console's charts, failing view and bulk actions in a real browser (gateway/http/
console_static/chart.js, history.js, failures.js): a `gateway serve` process over the
real Postgres and Redis, with 2-second history buckets and a janitor that rolls them up
every half second, and Debian's Chromium driven by Playwright.

A burst of enqueues, completions, failures and deaths on two runtimes; once the rollup
has read the queue depth, the runtimes page's fleet chart and sparkline, and a runtime's
throughput and depth charts, hold the numbers the API answers (read from their text
alternatives), over the last hour, day and week; the charts read by keyboard; the
failing view orders the runtimes by failures, with their error groups (a hostile error
line shown as text); a group's retry, a retry of every dead task and a cancel of every
queued one (1,001 tasks: two calls, the second offered when the first says `more`) each
state their count before they run, and change the tasks in the database as they say.

Chromium missing: the test fails with CI=true, and is skipped otherwise."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest

from tests.support.browser import Api, browser_page
from tests.support.gateways import TOKEN, serve_env, serve_process

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]

HOSTILE = "<img src=x onerror=document.title='pwned'> broke"
TIMEOUT = "TimeoutError: the build took longer than 3600 s"
TITLE = "claim-gateway console"


async def burst(api: Api, rt: str, complete: int, retry: int, dead: list[str]) -> None:
    """Enqueues as many tasks as it needs, claims them all, then completes `complete`,
    fails `retry` with a retry (failed, queued again) and one per error of `dead`
    without one (dead)."""
    n = complete + retry + len(dead)
    batch = [{"payload": {"n": i, "html": HOSTILE}} for i in range(n)]
    await api.ok("POST", f"/v1/runtimes/{rt}/tasks:batch", {"tasks": batch})
    claimed = (
        await api.ok("POST", f"/v1/runtimes/{rt}/claim", {"worker_id": "w", "max_tasks": n})
    )["tasks"]
    assert len(claimed) == n
    outcomes: list[tuple[str, dict[str, Any]]] = (
        [("complete", {"result": 1})] * complete
        + [("fail", {"error": "flaky", "retry": True})] * retry
        + [("fail", {"error": e, "retry": False}) for e in dead]
    )
    for task, (op, body) in zip(claimed, outcomes, strict=True):
        await api.ok("POST", f"/v1/tasks/{task['id']}/{op}", {"lease_id": task["lease_id"], **body})


async def rolled_up(api: Api, rt: str) -> dict[str, Any]:
    """The runtime's history once the janitor has read the depth after its last
    activity."""
    async with asyncio.timeout(15):
        while True:
            answer: dict[str, Any] = await api.ok("GET", f"/v1/runtimes/{rt}/history?window=1h")
            if answer["points"] and answer["points"][-1]["depth"] is not None:
                return answer
            await asyncio.sleep(0.25)


async def column_sums(table: Any, keys: list[str]) -> dict[str, int]:
    """The sums of a chart's table of numbers, per column (a dash counts 0)."""
    sums = {}
    for key in keys:
        cells = await table.locator(f'td[data-key="{key}"]').all_text_contents()
        sums[key] = sum(int(c) for c in cells if c != "—")
    return sums


async def statuses(api: Api, rt: str, status: str) -> set[str]:
    answer = await api.ok("GET", f"/v1/runtimes/{rt}/tasks?status={status}&limit=1000")
    return {t["id"] for t in answer["tasks"]}


@pytest.mark.timeout(90)  # a process starts; the browser part itself takes ~10 s
async def test_charts_failing_view_and_bulk_actions(
    chromium, fresh_database_url, redis_url, redis_prefix, runtime_id
):
    rt, other = runtime_id, f"{runtime_id}-b"
    env = serve_env(
        fresh_database_url,
        redis_url,
        redis_prefix,
        GATEWAY_HISTORY_INTERVAL_SECONDS="2",
        GATEWAY_JANITOR_INTERVAL_SECONDS="0.5",
    )
    async with (
        serve_process("--migrate", env=env) as (proc, base),
        aiohttp.ClientSession() as http,
    ):
        admin = Api(http, base, TOKEN)
        operator = await admin.make_token(["read", "enqueue"], [rt, other])
        ops = Api(http, base, operator)
        await burst(admin, rt, complete=3, retry=2, dead=[HOSTILE] * 3 + [TIMEOUT] * 2)
        await burst(admin, other, complete=1, retry=0, dead=["OSError: disk full"])
        history = await rolled_up(ops, rt)
        # The two that failed with a retry are queued again.
        assert history["points"][-1]["depth"] == 2, history
        fleet = await ops.ok("GET", "/v1/history?window=1h")
        top = [r["runtime_id"] for r in fleet["top_by_failures"]]
        assert top == [rt, other], top

        problems: list[str] = []
        async with browser_page() as page:
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else 0)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.set_default_timeout(10_000)

            # The runtimes page: the fleet's chart and each runtime's sparkline.
            await page.goto(f"{base}/console#token={operator}")
            fleet_chart = page.locator("#fleet-chart")
            await fleet_chart.locator("tbody td").first.wait_for(state="attached")
            sums = await column_sums(fleet_chart, ["enqueued", "completed"])
            assert sums == {"enqueued": 10 + 2, "completed": 3 + 1}, sums
            label = await fleet_chart.locator("svg[role=img]").get_attribute("aria-label")
            assert "Enqueued: 12 in all" in label and "Completed: 4 in all" in label, label
            spark = (
                page.locator("#runtimes tbody tr")
                .filter(has=page.get_by_role("link", name=rt, exact=True))
                .locator(".sparkline")
            )
            await spark.wait_for()
            said = await spark.get_attribute("aria-label")
            assert said.startswith("Queue depth, last hour: read ") and ", last 2 at " in said, said
            assert await spark.locator("path").count() == 1

            # A runtime's charts: throughput and depth, as the API counts them.
            await page.goto(f"{base}/console#/runtime/{rt}")
            throughput = page.locator("#throughput-chart")
            await throughput.locator("tbody td").first.wait_for(state="attached")
            keys = ["enqueued", "completed", "failed", "dead"]
            expected = {k: sum(p[k] for p in history["points"]) for k in keys}
            assert expected == {"enqueued": 10, "completed": 3, "failed": 2, "dead": 5}
            assert await column_sums(throughput, keys) == expected
            depths = await page.locator('#depth-chart td[data-key="depth"]').all_text_contents()
            assert [d for d in depths if d != "—"][-1] == "2", depths
            # The depth is drawn as steps, with a dot at each value read.
            assert await page.locator("#depth-chart circle").count() >= 1
            # By keyboard: the chart takes the focus; the arrows read a column aloud.
            await throughput.locator("svg[role=img]").focus()
            await page.keyboard.press("End")
            readout = throughput.locator(".readout")
            # An hour of 2-second buckets is drawn in columns of 30 s (at most 180).
            text = await readout.inner_text()
            assert re.fullmatch(
                r"\d\d:\d\d:[03]0\u2013\d\d:\d\d:[03]0 UTC: \d+ enqueued, .* dead", text
            ), text
            # Another window: the same numbers, over the last day.
            await page.get_by_role("button", name="Last 24 hours").click()
            await page.locator(".history .stamp", has_text="Last 24 hours").wait_for()
            assert await column_sums(throughput, keys) == expected
            await page.get_by_role("button", name="Last 7 days").click()
            await page.locator(".history .stamp", has_text="Last 7 days").wait_for()
            assert await column_sums(throughput, keys) == expected
            # A week in columns of an hour (at most 180 columns).
            label = await throughput.locator("svg[role=img]").get_attribute("aria-label")
            assert label.startswith("Throughput, per hour (UTC). Enqueued: 10 in all"), label

            # 1,001 tasks queued in the other runtime, for a cancel of more than a call.
            for _ in range(2):
                batch = [{"payload": i} for i in range(500)]
                await ops.ok("POST", f"/v1/runtimes/{other}/tasks:batch", {"tasks": batch})
            await ops.enqueue(other, "one more")

            # The failing view: by failures, with the error groups as text.
            await page.get_by_role("link", name="Failing runtimes").first.click()
            sections = page.locator(".failing-runtime")
            await sections.nth(1).locator(".groups").wait_for()
            assert await sections.locator("h2").all_inner_texts() == [rt, other]
            mine = sections.nth(0)
            assert "2 failed and 5 dead in the last hour." in await mine.inner_text()
            hostile = mine.locator(".groups tbody tr", has_text="broke")
            assert await hostile.locator("code").text_content() == HOSTILE
            assert await hostile.locator("td").first.inner_text() == "3"
            assert await page.locator("main img").count() == 0
            assert await page.title() == TITLE

            # Retry one group: the confirmation states the count; the tasks are queued.
            dead_before = await statuses(ops, rt, "dead")
            await hostile.get_by_role("button", name="Retry these 3").click()
            confirm = mine.locator(".confirm")
            assert "Retry the 3 tasks of " in await confirm.inner_text()
            await confirm.get_by_role("button", name="Retry 3 tasks").click()
            await mine.get_by_role("status").filter(has_text="Retried 3 tasks").wait_for()
            left = await statuses(ops, rt, "dead")
            assert len(left) == 2 and left < dead_before
            assert dead_before - left <= await statuses(ops, rt, "queued")
            # Every dead task: the count read back, then none left.
            retry_all = mine.get_by_role("button", name="Retry all 2 dead")
            await retry_all.click()
            assert "Retry the 2 dead tasks of" in await confirm.inner_text()
            await confirm.get_by_role("button", name="Retry 2 tasks").click()
            await mine.get_by_role("status").filter(has_text="Retried 2 tasks").wait_for()
            assert await statuses(ops, rt, "dead") == set()

            # Cancel every queued task of the other runtime: 1,001, over two calls.
            theirs = sections.nth(1)
            cancel = theirs.get_by_role("button", name="Cancel all 1001 queued")
            await cancel.click()
            confirm = theirs.locator(".confirm")
            assert "Cancel the 1001 tasks queued in " in await confirm.inner_text()
            await confirm.get_by_role("button", name="Cancel 1001 tasks").click()
            status = theirs.get_by_role("status")
            await status.filter(
                has_text="Cancelled 1000 tasks. More queued tasks are left"
            ).wait_for()
            await status.get_by_role("button", name="Run it again").click()
            await status.filter(has_text="Cancelled 1 task.").wait_for()
            assert await statuses(ops, other, "queued") == set()

            # A 400-pixel window: no page scrolls sideways (tables do, inside).
            await page.set_viewport_size({"width": 400, "height": 800})
            for where, ready in (
                ("#/", "#fleet-chart svg"),
                (f"#/runtime/{rt}", "#wait-chart svg"),
                ("#/failing", ".failing-runtime"),
            ):
                await page.goto(f"{base}/console{where}")
                await page.locator(ready).first.wait_for()
                width = await page.evaluate("document.documentElement.scrollWidth")
                assert width <= 400, (where, width)

        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    # No CSP violation (an inline style would be one) and no script error.
    assert problems == [], problems
