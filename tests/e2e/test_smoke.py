from __future__ import annotations

from tests.support.gateways import make_settings, running_gateway


async def test_enqueue_claim_complete(database_url, redis_url, redis_prefix, runtime_id):
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, {"hello": "world"})
        assert task["status"] == "queued"
        claimed = await gw.claim(runtime_id)
        assert [t["id"] for t in claimed] == [task["id"]]
        status, done = await gw.complete(claimed[0], result={"ok": True})
        assert status == 200, done
        assert done["status"] == "completed" and done["result"] == {"ok": True}
