"""Health, readiness and metrics endpoints, as an operator sees them."""

from __future__ import annotations

from tests.support.gateways import make_settings, running_gateway


async def test_health_ready_and_metrics_need_no_token(database_url, redis_url, redis_prefix):
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        for path, expected in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
            async with gw.http.get(gw.url + path) as resp:
                assert resp.status == 200
                assert await resp.json() == expected


async def test_metrics_count_what_the_claim_path_did(
    database_url, redis_url, redis_prefix, runtime_id
):
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        await gw.enqueue(runtime_id, 1)
        assert len(await gw.claim(runtime_id)) == 1
        assert await gw.claim(runtime_id) == []  # miss: Postgres finds nothing
        assert await gw.claim(runtime_id) == []  # hit: from the near-cache, no Redis read
        async with gw.http.get(gw.url + "/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["content-type"].startswith("text/plain")
            text = await resp.text()
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["gateway_tasks_enqueued_total"] == 1
    assert values["gateway_tasks_claimed_total"] == 1
    assert values["gateway_postgres_claims_total"] == 2
    assert values["gateway_verdict_local_hits_total"] == 1
    assert 'gateway_verdict_checks_total{outcome="hit"}' not in values
    assert values['gateway_verdict_checks_total{outcome="miss"}'] == 2
    assert "gateway_parked_polls" in values


async def test_readyz_is_503_while_the_schema_is_behind(
    fresh_database_url, redis_url, redis_prefix
):
    async with running_gateway(make_settings(fresh_database_url, redis_url, redis_prefix)) as gw:
        async with gw.http.get(gw.url + "/readyz") as resp:
            assert resp.status == 503
            body = await resp.json()
    assert any("gateway migrate" in p for p in body["problems"]), body
