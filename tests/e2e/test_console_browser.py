"""The console in a real browser: a `gateway serve` process over the real Postgres and
Redis, and Debian's Chromium driven by Playwright. Signs in through a /console#token=
link, reads the runtimes, a runtime and a task, cancels a task, is refused with a
read-only token, and pauses a runtime (a claim parks) and resumes it (the claim is
answered).

Chromium missing: the test fails with CI=true, and is skipped otherwise."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest

from tests.support.browser import Api, browser_page
from tests.support.gateways import TOKEN, serve_env, serve_process

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.slow]

BIG = "18446744073709551616.000000000000000000001"  # JSON.parse would round it
HOSTILE = "<img src=x onerror=document.title='pwned'>"


@pytest.mark.timeout(90)  # two processes start; the browser part itself takes ~10 s
async def test_the_console_in_a_browser(
    chromium, fresh_database_url, redis_url, redis_prefix, runtime_id
):
    # Every request's access line (a tenth of the 2xx ones by default).
    env = {
        **serve_env(fresh_database_url, redis_url, redis_prefix),
        "GATEWAY_ACCESS_LOG_SAMPLE": "1",
    }
    async with serve_process(
        "--migrate", "--access-log", env=env, stdout=asyncio.subprocess.PIPE
    ) as (proc, base):
        assert proc.stdout is not None and proc.stderr is not None
        logs = asyncio.gather(proc.stdout.read(), proc.stderr.read())
        async with aiohttp.ClientSession() as http:
            admin = Api(http, base, TOKEN)
            operator = await admin.make_token(["read", "enqueue"], [runtime_id])
            viewer = await admin.make_token(["read"], [runtime_id])
            controller = await admin.make_token(["read", "control"], [runtime_id])
            other = f"{runtime_id}-other"
            await admin.enqueue(other, "not yours")
            ops = Api(http, base, operator)
            tasks = [await ops.enqueue(runtime_id, {"n": i}) for i in range(3)]
            odd = await ops.enqueue(runtime_id, {"big": "<raw>", "html": HOSTILE})
            # A number no double holds, sent as raw JSON text, as a tenant may.
            async with http.post(
                f"{base}/v1/runtimes/{runtime_id}/tasks",
                data=f'{{"payload": {{"amount": {BIG}}}}}',
                headers={"Authorization": f"Bearer {operator}"},
            ) as resp:
                assert resp.status == 201
                exact = await resp.json()

            sent: list[str] = []
            problems: list[str] = []
            async with browser_page() as page:
                page.on("request", lambda r: sent.append(r.url))
                page.on("console", lambda m: problems.append(m.text) if m.type == "error" else 0)
                page.on("pageerror", lambda e: problems.append(str(e)))
                page.set_default_timeout(10_000)

                # Sign in through the link: the fragment goes at once.
                await page.goto(f"{base}/console#token={operator}")
                row = page.locator("#runtimes tbody tr", has_text=runtime_id)
                await row.wait_for()
                assert "token" not in page.url and operator not in page.url
                # Replaced, not pushed: about:blank and this page, no entry with the token.
                assert await page.evaluate("history.length") == 2
                assert await row.locator("td").nth(0).inner_text() == "5"  # queued
                assert await page.locator("#runtimes", has_text=other).count() == 0
                assert operator not in await page.content()

                # A runtime: its counts and tasks; the counts refresh by themselves.
                await row.get_by_role("link", name=runtime_id).click()
                queued = page.locator(".card.s-queued .value")
                await page.wait_for_selector("#tasks")
                assert await queued.inner_text() == "5"
                await ops.enqueue(runtime_id, {"n": "late"})
                # (The policy forbids eval, so no wait_for_function: locators only.)
                await queued.filter(has_text=re.compile(r"^6$")).wait_for()
                assert await page.locator("#tasks tbody tr").count() == 6

                # A task: the payload shown exactly and as text, never as HTML.
                # Tasks are shown by the end of their id (the random part).
                await page.get_by_role("link", name=odd["id"][-8:]).click()
                payload = page.locator("section", has_text="Payload").locator("pre")
                await payload.wait_for()
                assert HOSTILE in await payload.inner_text()
                assert await page.locator("main img").count() == 0
                assert await page.title() == "claim-gateway console"
                await page.goto(f"{base}/console#/task/{exact['id']}")
                await page.locator("section", has_text="Payload").wait_for()
                assert f'"amount": {BIG}' in await page.locator("pre").first.inner_text()

                # Cancel a queued task; its status changes on the page.
                await page.goto(f"{base}/console#/task/{tasks[0]['id']}")
                await page.get_by_role("button", name="Cancel task").click()
                await page.get_by_role("status").filter(has_text="Cancelled.").wait_for()
                await page.locator(".taskhead .badge", has_text="cancelled").wait_for()
                assert await page.get_by_role("button", name="Retry task").count() == 1
                assert (await ops.ok("GET", f"/v1/tasks/{tasks[0]['id']}"))["status"] == (
                    "cancelled"
                )

                # A read-only token signs in by the form and is refused, clearly.
                await page.get_by_role("button", name="Sign out").click()
                await page.get_by_label("API token").fill(viewer)
                await page.get_by_role("button", name="Sign in").click()
                # Back where it was: the cancelled task, whose Retry it may not use either.
                await page.get_by_role("button", name="Retry task").wait_for()
                await page.goto(f"{base}/console#/task/{tasks[1]['id']}")
                await page.get_by_role("button", name="Cancel task").click()
                alert = page.get_by_role("alert")
                await alert.wait_for()
                text = await alert.inner_text()
                assert "Forbidden (403)" in text and "'enqueue' scope" in text, text
                assert (await ops.ok("GET", f"/v1/tasks/{tasks[1]['id']}"))["status"] == "queued"
                assert viewer not in await page.content()

                # By keyboard: Tab reaches the sort button, focus shows, Enter sorts.
                await page.goto(f"{base}/console#/")
                await page.locator("#runtimes").wait_for()
                # A 400-pixel window: the page does not scroll sideways (tables do, inside).
                await page.set_viewport_size({"width": 400, "height": 800})
                for where, ready in (("#/", "#runtimes"), (f"#/runtime/{runtime_id}", "#tasks")):
                    await page.goto(f"{base}/console{where}")
                    await page.locator(ready).wait_for()
                    width = await page.evaluate("document.documentElement.scrollWidth")
                    assert width <= 400, (where, width)
                await page.set_viewport_size({"width": 1280, "height": 800})
                await page.goto(f"{base}/console#/")
                await page.locator("#runtimes").wait_for()
                for _ in range(20):
                    await page.keyboard.press("Tab")
                    focused = await page.evaluate("document.activeElement.textContent")
                    if focused.startswith("Runtime"):
                        break
                assert focused.startswith("Runtime"), focused
                outline = "getComputedStyle(document.activeElement).outlineStyle"
                assert await page.evaluate(outline) == "solid"
                await page.keyboard.press("Enter")
                header = page.locator('th[data-key="runtime_id"]')
                assert await header.get_attribute("aria-sort") == "descending"

                # Runtime controls: pause from the runtime's page; a claim with a wait
                # parks (stats count it, it does not return); Resume answers it.
                await page.goto(f"{base}/console#/runtime/{runtime_id}")
                await page.get_by_role("button", name="Sign out").click()
                await page.get_by_label("API token").fill(controller)
                await page.get_by_role("button", name="Sign in").click()
                await page.get_by_label("Reason for pausing").fill("disk <b>full</b>")
                await page.get_by_role("button", name="Pause runtime").click()
                await page.get_by_role("status").filter(has_text="Paused").wait_for()
                await page.locator("#runtime-state .badge", has_text="paused").wait_for()
                # The reason is shown as text, and stored as given.
                shown = page.locator("#pause-reason-shown")
                assert (await shown.text_content() or "").strip() == "Reason: disk <b>full</b>."
                assert (await admin.ok("GET", f"/v1/runtimes/{runtime_id}/controls"))[
                    "paused_reason"
                ] == "disk <b>full</b>"
                claim = asyncio.create_task(
                    admin.ok(
                        "POST",
                        f"/v1/runtimes/{runtime_id}/claim",
                        {"worker_id": "console-test", "wait_seconds": 30},
                    )
                )
                parked = page.locator(".card", has_text="parked pollers").locator(".value")
                await parked.filter(has_text=re.compile(r"^1$")).wait_for()
                assert not claim.done()
                # The runtimes list shows the state.
                await page.goto(f"{base}/console#/")
                paused_row = page.locator("#runtimes tbody tr", has_text=runtime_id)
                await paused_row.locator(".badge", has_text="paused").wait_for()
                assert not claim.done()
                await page.goto(f"{base}/console#/runtime/{runtime_id}")
                await page.get_by_role("button", name="Resume runtime").click()
                await page.get_by_role("status").filter(has_text="Resumed.").wait_for()
                answered = await asyncio.wait_for(claim, 10)
                assert [t["worker_id"] for t in answered["tasks"]] == ["console-test"]
                # The limits form: saved, shown, and a bad value refused naming the field.
                await page.get_by_label("Max in flight").fill("4")
                await page.get_by_role("button", name="Save limits").click()
                await page.get_by_role("status").filter(has_text="Limits saved.").wait_for()
                await page.locator("#runtime-state", has_text="at most 4 in flight").wait_for()
                assert (await admin.ok("GET", f"/v1/runtimes/{runtime_id}/controls"))[
                    "max_in_flight"
                ] == 4
                # The runtimes list shows how many of a runtime's tasks ended dead.
                for n in range(2):
                    await admin.ok("POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": n})
                [doomed] = (
                    await admin.ok(
                        "POST", f"/v1/runtimes/{runtime_id}/claim", {"worker_id": "doomed"}
                    )
                )["tasks"]
                await admin.ok(
                    "POST",
                    f"/v1/tasks/{doomed['id']}/fail",
                    {"lease_id": doomed["lease_id"], "error": "broken", "retry": False},
                )
                await page.goto(f"{base}/console#/")
                row = page.locator("#runtimes tbody tr", has_text=runtime_id)
                await row.wait_for()
                dead_column = await page.locator("#runtimes thead th").all_text_contents()
                dead_cell = row.locator("td").nth(dead_column.index("Dead") - 1)
                await dead_cell.filter(has_text=re.compile(r"^1$")).wait_for()

        proc.terminate()
        text = b"".join(await asyncio.wait_for(logs, 30)).decode()
        await proc.wait()
    # No CSP violation and no script error: the one error logged is the refused cancel.
    refused = "Failed to load resource: the server responded with a status of 403 (Forbidden)"
    assert problems == [refused], problems
    assert any(u.endswith("/console/assets/app.js") for u in sent)
    for token in (operator, viewer, controller):
        assert not any(token in url for url in sent), sent
        assert token not in text
    assert "GET /console 200" in text and "GET /v1/runtimes 200" in text
    assert re.search(r"POST /v1/tasks/\{task_id\}/cancel 403", text)
