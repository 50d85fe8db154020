"""Documentation of the admin API and the signed webhook, beside docs.py's. The request
bodies are api/credential_bodies.py's and api/bodies.py's, built from the rules their
parsers use, so the document cannot promise what the code refuses.
"""

from __future__ import annotations

from typing import Any

from ..api import bodies, credential_bodies, requests
from ..api.answers import TIME_SCHEMA, UUID_SCHEMA
from ..api.credential_bodies import (
    INCLUDE_REVOKED,
    SCOPES_SCHEMA,
    TOKEN_REQUEST,
    TOKENS_QUERY,
    WEBHOOK_SECRET_REQUEST,
    object_schema,
)
from ..api.fields import JSON_VALUE, Body, Field, Kind, RawBody
from ..auth import credentials, webhooks
from ..errors import AlreadyExists, IdempotencyKeyReused, InvalidSignature, NotFound
from .docs import REPLAYED, TASK, Doc, Param, Reply

_TOKEN_BASE = {
    "id": UUID_SCHEMA,
    "name": {"type": "string"},
    "scopes": SCOPES_SCHEMA,
    "runtimes": {"type": ["array", "null"], "items": {"type": "string"}},
    "created_at": TIME_SCHEMA,
}
_SECRET_BASE = {
    "id": UUID_SCHEMA,
    "name": {"type": "string"},
    "runtimes": {"type": "array", "items": {"type": "string"}},
    "created_at": TIME_SCHEMA,
}
_REVOKED = {"revoked_at": {**TIME_SCHEMA, "type": ["string", "null"]}}
_TOKEN_SECRET = {"token": {"type": "string", "description": "The secret, shown this once."}}
_WEBHOOK_SECRET = {
    "secret": {
        "type": "string",
        "pattern": f"^{credentials.WEBHOOK_SECRET_PREFIX}",
        "description": "The whsec_ secret, shown this once.",
    }
}
NO_STORE = Param(
    "Cache-Control",
    "The answer holds a secret: never cached.",
    {"type": "string", "const": "no-store"},
)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _described(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, **schema}


# The admin answers' schemas, by name in the document's components.
SCHEMAS: dict[str, dict[str, Any]] = {
    "Token": _described(
        "An API token, never its secret.",
        object_schema([*_TOKEN_BASE, "revoked_at"], {**_TOKEN_BASE, **_REVOKED}),
    ),
    "CreatedToken": _described(
        "A token just created, with its secret.",
        object_schema([*_TOKEN_BASE, "token"], {**_TOKEN_BASE, **_TOKEN_SECRET}),
    ),
    "TokenPage": _described(
        "A page of tokens, oldest first.",
        object_schema(
            ["tokens", "next_cursor"],
            {
                "tokens": {"type": "array", "items": _ref("Token")},
                "next_cursor": {
                    "type": ["string", "null"],
                    "description": "Where the next page starts; null on the last one.",
                },
            },
        ),
    ),
    "WebhookSecret": _described(
        "A webhook signing secret's record, never the secret itself.",
        object_schema([*_SECRET_BASE, "revoked_at"], {**_SECRET_BASE, **_REVOKED}),
    ),
    "CreatedWebhookSecret": _described(
        "A webhook signing secret just created, with the secret.",
        object_schema([*_SECRET_BASE, "secret"], {**_SECRET_BASE, **_WEBHOOK_SECRET}),
    ),
    "WebhookSecretList": _described(
        "Webhook secrets, oldest first.",
        object_schema(
            ["webhook_secrets"],
            {"webhook_secrets": {"type": "array", "items": _ref("WebhookSecret")}},
        ),
    ),
}


def _revoke(operation_id: str, what: str, param: str) -> Doc:
    return Doc(
        operation_id,
        f"Revoke a {what}",
        (Reply(204, "Revoked (also when it was revoked before).", None),),
        "Every instance refuses it within 2 s. An unknown id is `404`.",
        tag="admin",
        path_params=(Param(param, f"The {what}'s id.", UUID_SCHEMA),),
        errors=(NotFound,),
    )


CREATE_TOKEN = Doc(
    "createToken",
    "Create a scoped API token",
    (
        Reply(
            201,
            "Created; the secret is in `token`, shown this once.",
            "CreatedToken",
            headers=(NO_STORE,),
        ),
    ),
    "Only the SHA-256 of the secret is kept.",
    tag="admin",
    body=TOKEN_REQUEST,
    errors=(AlreadyExists,),
)
LIST_TOKENS = Doc(
    "listTokens",
    "List API tokens, never their secrets",
    (
        Reply(
            200,
            "A page of tokens (live ones, unless include_revoked), oldest first; next_cursor "
            "is null on the last one.",
            "TokenPage",
        ),
    ),
    f"At most `limit` ({credential_bodies.MAX_TOKENS_PAGE} at most) tokens per page; pass "
    "`next_cursor` back as `cursor` for the next page. A bad `limit` or `cursor` is `422` "
    "naming it.",
    tag="admin",
    query=TOKENS_QUERY,
)
REVOKE_TOKEN = _revoke("revokeToken", "token", "token_id")
CREATE_WEBHOOK_SECRET = Doc(
    "createWebhookSecret",
    "Create a webhook signing secret",
    (
        Reply(
            201,
            "Created; the secret is in `secret`, shown this once.",
            "CreatedWebhookSecret",
            headers=(NO_STORE,),
        ),
    ),
    "Verifying a signature needs the key, so it is stored in clear in the database.",
    tag="admin",
    body=WEBHOOK_SECRET_REQUEST,
    errors=(AlreadyExists,),
)
LIST_WEBHOOK_SECRETS = Doc(
    "listWebhookSecrets",
    "List webhook secrets, never the secrets themselves",
    (
        Reply(
            200,
            "Live secrets, oldest first.",
            "WebhookSecretList",
        ),
    ),
    tag="admin",
    query=INCLUDE_REVOKED,
)
REVOKE_WEBHOOK_SECRET = _revoke("revokeWebhookSecret", "webhook secret", "secret_id")

_SIGNATURE_HEADERS = (
    Field(
        "webhook-id",
        Kind.STRING,
        "The delivery's id, also its idempotency key: a redelivery with the same id "
        "answers the task already stored.",
        required=True,
        max_length=webhooks.MAX_MSG_ID,
    ),
    Field(
        "webhook-timestamp",
        Kind.STRING,
        f"Unix seconds; more than {webhooks.TOLERANCE_SECONDS} s from the gateway's clock "
        "is refused.",
        required=True,
    ),
    Field(
        "webhook-signature",
        Kind.STRING,
        "Space-separated `v1,<base64 HMAC-SHA256 of id.timestamp.body>` signatures; one "
        "matching a live secret covering the runtime is enough.",
        required=True,
    ),
)
RECEIVE_WEBHOOK = Doc(
    "receiveWebhook",
    "Enqueue a delivery signed the Standard Webhooks way",
    (
        Reply(201, "Stored; its body is the task's payload.", TASK),
        Reply(200, "A redelivery of the same webhook-id.", TASK, headers=(REPLAYED,)),
    ),
    "The signature authenticates it: no bearer token. A bad, missing or stale signature, "
    "or no secret covering the runtime, is `401 invalid_signature` and nothing is stored.",
    tag="producers",
    body=RawBody(
        "WebhookPayload",
        "The event: any JSON value, kept exactly.",
        {"$ref": f"#/components/schemas/{JSON_VALUE}"},
    ),
    query=Body(
        "WebhookQuery",
        "Enqueue options.",
        tuple(bodies.ENQUEUE_BODY[name] for name in requests.QUERY_FIELDS),
    ),
    headers=(*_SIGNATURE_HEADERS, *bodies.TRACE_HEADERS),
    errors=(InvalidSignature, IdempotencyKeyReused),
)
