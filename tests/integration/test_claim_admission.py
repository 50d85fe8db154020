"""I9: a global bound on concurrent Postgres claims per process turns overload into
queueing, then 429 with Retry-After."""

from __future__ import annotations

import asyncio

from tests.support.gateways import TOKEN, make_settings, running_gateway
from tests.support.metrics import sample


async def test_claims_beyond_the_queue_bound_get_429_with_retry_after(
    database_url, redis_url, redis_prefix, runtime_id, monkeypatch
):
    settings = make_settings(
        database_url, redis_url, redis_prefix, max_concurrent_claims=1, max_queued_claims=1
    )
    async with running_gateway(settings) as gw:
        store = gw.gateway.store
        original = store.claim
        in_flight = 0
        most = 0

        async def slow_claim(*args, **kwargs):
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                await asyncio.sleep(0.5)
                return await original(*args, **kwargs)
            finally:
                in_flight -= 1

        monkeypatch.setattr(store, "claim", slow_claim)
        # Six runtimes: six pumps want a Postgres claim at once. One runs, one waits in
        # line, the other four are refused.
        answers = await asyncio.gather(
            *(
                gw.http.post(
                    f"{gw.url}/v1/runtimes/{runtime_id}-{i}/claim",
                    json={"worker_id": "w"},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
                for i in range(6)
            )
        )
        statuses = sorted(r.status for r in answers)
        refused = [r for r in answers if r.status == 429]
        assert statuses == [200, 200, 429, 429, 429, 429], statuses
        for resp in refused:
            assert int(resp.headers["Retry-After"]) >= 1
            body = await resp.json(content_type=None)
            assert body["code"] == "overloaded"
        for resp in answers:
            resp.release()
        assert most == 1
        assert sample(gw, "gateway_claims_rejected_total", reason="database_queue") == 4
