"""The signed enqueue's handler, `POST /v1/runtimes/{rt}/webhooks`: a Standard Webhooks
delivery, checked by the Verifier (auth/webhooks.py), becomes a task whose idempotency key
is `webhook:<webhook-id>`. It imports no driver; gateway/http/routes.py holds the endpoint
table and turns its errors into answers.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...api import decode, exactjson, render, requests, trace
from ...api.requests import query_fields
from ...auth.webhooks import KEY_PREFIX, MAX_MSG_ID, parse_headers
from ...errors import BadRequest, ValidationFailed
from ...instance import Gateway
from ..io import json_response, read_body
from .sending import Sending


async def receive(request: Request, gw: Gateway) -> Response:
    """Enqueue a signed delivery: its JSON body is the task's payload. 201 with the
    task; 200 with Idempotent-Replayed for a redelivery of the same webhook-id; 401
    for any signature problem; nothing is stored unless the signature matches."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    # Cheap refusals first: no body is read and no secret looked up for them.
    delivery = parse_headers(request.headers, gw.webhooks.clock())
    raw = await read_body(request, gw.settings.max_body_bytes)
    await gw.webhooks.verify(runtime_id, delivery, raw)
    if len(delivery.msg_id) > MAX_MSG_ID:
        raise ValidationFailed(
            f"webhook-id must be at most {MAX_MSG_ID} characters", field="webhook-id"
        )
    fields: dict[str, Any] = dict(query_fields(request.query_params.multi_items()))
    if not raw.strip():
        raise BadRequest("the delivery's body is empty; it must be a JSON value")
    settings = gw.settings
    fields["payload"] = decode.decode_json(raw, "payload", settings.max_json_depth)
    # The key is set after parsing: the prefix is refused to whoever sends it as a key.
    req = requests.parse_enqueue(
        fields, None, settings.max_payload_bytes, settings.max_json_depth, settings.max_body_bytes
    )._replace(idempotency_key=KEY_PREFIX + delivery.msg_id)
    repeated = exactjson.repeated_key(raw)
    if repeated is not None:
        raise ValidationFailed(
            f"the delivery's body holds the key {repeated[:100]!r} twice in one object; "
            "JSON readers differ on which value counts, so a signed body must not",
            field="payload",
        )
    sending = Sending(runtime_id, [req], trace.from_headers(request.headers))
    try:
        row, created = await gw.store.enqueue(runtime_id, sending.requests[0])
    except Exception as exc:
        sending.failed(exc)
        raise
    sending.sent([row.id], created)
    if not created:
        return json_response(render.render_task_or_stub(row), 200, {"Idempotent-Replayed": "true"})
    await gw.claimer.announce(runtime_id)
    return json_response(render.render_task_or_stub(row), 201)
