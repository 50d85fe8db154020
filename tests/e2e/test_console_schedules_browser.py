"""The console's schedules panel in a real browser (gateway/http/console_static/
schedules.js): a `gateway serve` process over the real Postgres and Redis, and Debian's
Chromium driven by Playwright.

Two schedules made through the API (one every 10 s, one cron in Europe/Paris with a
hostile note) are shown on their runtime's page with their next run; one is paused from
the page with a note (the API then says so) and resumed; the other is run now (a task
of the schedule appears, and its row links it); a read-only token's pause is refused in
the panel while the page goes on; the note is shown as text and never runs; a runtime
without schedules says so; more than a page of schedules is paged.

Chromium missing: the test fails with CI=true, and is skipped otherwise."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from tests.support.browser import Api, browser_page
from tests.support.gateways import TOKEN, serve_env, serve_process

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]

HOSTILE = "<img src=x onerror=document.title='pwned'>"
TITLE = "claim-gateway console"
PARIS = ZoneInfo("Europe/Paris")


def shown(iso: str) -> str:
    """A time as the console's tables write it, under a heading that says UTC:
    "2026-11-28 01:30:00"."""
    return f"{iso[:10]} {iso[11:19]}"


def paris(iso: str) -> str:
    """A time on Paris's clock as the console writes it: "2026-11-28 02:30:00"."""
    return f"{datetime.fromisoformat(iso).astimezone(PARIS):%Y-%m-%d %H:%M:%S}"


def schedules(rt: str, name: str = "", op: str = "") -> str:
    return f"/v1/runtimes/{rt}/schedules" + (f"/{name}" if name else "") + op


@pytest.mark.timeout(90)  # two processes start; the browser part itself takes ~10 s
async def test_the_schedules_panel_in_a_browser(
    chromium, fresh_database_url, redis_url, redis_prefix, runtime_id
):
    rt, bare = runtime_id, f"{runtime_id}-bare"
    env = serve_env(fresh_database_url, redis_url, redis_prefix)
    async with (
        serve_process("--migrate", env=env) as (proc, base),
        aiohttp.ClientSession() as http,
    ):
        admin = Api(http, base, TOKEN)
        operator = await admin.make_token(["read", "enqueue"], [rt, bare])
        viewer = await admin.make_token(["read"], [rt])
        ops = Api(http, base, operator)
        await ops.ok("PUT", schedules(rt, "every-ten"), {"every_seconds": 10, "payload": 1})
        nightly: dict[str, Any] = await ops.ok(
            "PUT",
            schedules(rt, "nightly"),
            {
                "cron": "30 2 * * *",
                "timezone": "Europe/Paris",
                "note": HOSTILE,
                "payload": {"job": "nightly"},
            },
        )

        problems: list[str] = []
        async with browser_page() as page:
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else 0)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.set_default_timeout(10_000)
            await page.goto(f"{base}/console#token={operator}")
            await page.get_by_role("heading", name="Runtimes").wait_for()

            # A runtime without schedules says so.
            await page.goto(f"{base}/console#/runtime/{bare}")
            panel = page.locator(".schedules")
            await panel.filter(has_text="This runtime has no schedules.").wait_for()
            assert await page.get_by_label("Note for a pause").is_hidden()

            # Both schedules: when they run (a cron in its zone), their overlap policy,
            # their next run in UTC and on the zone's clock, and their last tick.
            await page.goto(f"{base}/console#/runtime/{rt}")
            ten = page.locator("#schedules tbody tr", has_text="every-ten")
            night = page.locator("#schedules tbody tr", has_text="nightly")
            await ten.wait_for()
            cells = await ten.locator("td").all_inner_texts()
            assert cells[:2] == ["every 10 s", "skip"], cells
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d0\nNext 5", cells[2]), cells
            cells = await night.locator("td").all_inner_texts()
            assert cells[:2] == ["30 2 * * *\nin Europe/Paris", "skip"], cells
            first = nightly["next_run_at"]
            next_run = f"{shown(first)}\n{paris(first)} Europe/Paris"
            assert cells[2] == f"{next_run}\nNext 5", cells
            assert cells[3] == "never", cells
            # The next five ticks, each on the zone's clock too.
            await night.locator("summary", has_text="Next 5").click()
            ticks = await night.locator(".upcoming li").all_inner_texts()
            assert ticks == [f"{shown(t)}\n{paris(t)} Europe/Paris" for t in nightly["upcoming"]]
            # The hostile note is text: shown as written, no element made, nothing ran.
            note = night.locator(".schedule-note")
            assert await note.text_content() == f"Note: {HOSTILE}"
            assert await page.locator("main img").count() == 0
            assert await page.title() == TITLE

            # Pause from the page with a note: the API says paused, with the note.
            await page.get_by_label("Note for a pause").fill("image <b>rebuild</b>")
            await page.get_by_role("button", name="Pause schedule every-ten").click()
            await panel.get_by_role("status").filter(has_text="Paused every-ten").wait_for()
            read = await ops.ok("GET", schedules(rt, "every-ten"))
            assert (read["paused"], read["note"]) == (True, "image <b>rebuild</b>")
            await ten.locator(".badge", has_text="paused").wait_for()
            assert "none while paused" in await ten.inner_text()
            rebuild = await ten.locator(".schedule-note").text_content()
            assert rebuild == "Note: image <b>rebuild</b>"
            # The row was redrawn, and the focus went to its button again.
            focused = await page.evaluate("document.activeElement.getAttribute('aria-label')")
            assert focused == "Resume schedule every-ten"
            # The opened list of ticks stays open across the redraw.
            assert await night.locator("details[open]").count() == 1

            await page.get_by_role("button", name="Resume schedule every-ten").click()
            await panel.get_by_role("status").filter(has_text="Resumed every-ten").wait_for()
            assert (await ops.ok("GET", schedules(rt, "every-ten")))["paused"] is False
            await ten.locator(".badge", has_text="active").wait_for()

            # Run now: a task of the schedule, linked from the message and the row.
            await page.get_by_role("button", name="Run schedule nightly now").click()
            said = panel.get_by_role("status").filter(has_text="Ran nightly now")
            await said.wait_for()
            made = await ops.ok("GET", f"/v1/runtimes/{rt}/tasks?schedule=nightly")
            [task] = made["tasks"]
            assert task["schedule"] == "nightly" and task["payload"] == {"job": "nightly"}
            assert await said.get_by_role("link").inner_text() == task["id"][-8:]
            await night.get_by_role("link", name=task["id"][-8:]).wait_for()
            assert "queued" in await night.locator(".badge").all_inner_texts()
            await night.get_by_role("link", name=task["id"][-8:]).click()
            await page.locator(".taskhead", has_text=task["id"]).wait_for()

            # A read-only token: the pause is refused in the panel; the page goes on.
            await page.goto(f"{base}/console#/runtime/{rt}")
            await page.get_by_role("button", name="Sign out").click()
            await page.get_by_label("API token").fill(viewer)
            await page.get_by_role("button", name="Sign in").click()
            await page.get_by_role("button", name="Pause schedule nightly").click()
            alert = panel.get_by_role("alert")
            await alert.wait_for()
            text = await alert.inner_text()
            assert text.startswith("Could not pause nightly. Not allowed. Forbidden (403)"), text
            assert "'enqueue' scope" in text, text
            assert (await ops.ok("GET", schedules(rt, "nightly")))["paused"] is False
            later = await ops.enqueue(rt, {"n": "after the refusal"})
            # The page still refreshes by itself: the new task appears in its list.
            await page.locator("#tasks").get_by_role("link", name=later["id"][-8:]).wait_for()
            assert await page.locator("#schedules tbody tr").count() == 2
            assert await alert.is_visible()
            assert await page.title() == TITLE

            # More than a page (20): the rest is on the next one.
            for n in range(20):
                await ops.ok("PUT", schedules(rt, f"z-{n:02}"), {"cron": "0 3 * * *", "payload": n})
            await page.goto(f"{base}/console#/")
            await page.goto(f"{base}/console#/runtime/{rt}")
            rows = page.locator("#schedules tbody tr")
            await rows.filter(has_text="z-17").wait_for()
            assert await rows.count() == 20
            await panel.get_by_role("button", name="Next page").click()
            await rows.filter(has_text="z-19").wait_for()
            assert await rows.locator("th").all_inner_texts() == ["z-18", "z-19"]
            await panel.get_by_role("button", name="Previous page").click()
            await rows.filter(has_text="every-ten").wait_for()

            # A 400-pixel window: the page does not scroll sideways (the table does).
            await page.set_viewport_size({"width": 400, "height": 800})
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 400, width
            assert await page.title() == TITLE

        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
    # No CSP violation and no script error: the one error logged is the refused pause.
    refused = "Failed to load resource: the server responded with a status of 403 (Forbidden)"
    assert problems == [refused], problems
