"""The admin API's request bodies and query: tokens and webhook secrets, with the rules that
their parsers (auth/credentials.py) apply and the scopes a token may hold, so that the
document states exactly what those parsers accept."""

from __future__ import annotations

import enum
import re
from typing import Any

from .fields import Body, Field, Kind, RawBody


class Scope(enum.StrEnum):
    """What a token may do. `admin` implies every other scope."""

    ENQUEUE = "enqueue"  # enqueue, batch, cancel, retry
    CLAIM = "claim"  # claim, heartbeat, complete, fail, release
    READ = "read"  # get a task, list, stats
    ADMIN = "admin"  # everything, including tokens and webhook secrets
    CONTROL = "control"  # pause, resume and limit runtimes (runtime controls)


# A runtime pattern: a runtime id in which `*` matches any run of characters.
RUNTIME_PATTERN_RE = re.compile(r"^[A-Za-z0-9*][A-Za-z0-9._:*-]{0,127}$")


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,99}$")


MAX_PATTERNS = 100


# The token listing's page (GET /v1/admin/tokens, `gateway token list`), as the other
# listings page.
MAX_TOKENS_PAGE = 1000


TOKENS_LIMIT = Field(
    "limit", Kind.INTEGER, "Tokens per page.", default=100, minimum=1, maximum=MAX_TOKENS_PAGE
)


INCLUDE_REVOKED = Body(
    "IncludeRevoked",
    "Listing options.",
    (
        Field(
            "include_revoked",
            Kind.STRING,
            "`true` also lists revoked ones, with their revoked_at. Left out: false.",
            # Also read as 1 and 0, as before it was documented as a boolean.
            enum=("true", "false", "1", "0"),
            documented_as=Kind.BOOLEAN,
        ),
    ),
)


TOKENS_CURSOR = Field("cursor", Kind.STRING, "The next_cursor of the previous page.")


_NAME = {
    "type": "string",
    "pattern": NAME_RE.pattern,
    "description": "1-100 letters, digits and . _ : @ -, starting with a letter or digit; "
    "not shaped like a UUID. Unique among live ones.",
}


_PATTERNS = {
    "type": "array",
    "minItems": 1,
    "maxItems": MAX_PATTERNS,
    "items": {"type": "string", "pattern": RUNTIME_PATTERN_RE.pattern},
    "description": "Runtime ids in which `*` matches any run of characters.",
}


SCOPE_SCHEMA = {
    "type": "string",
    "enum": [scope.value for scope in Scope],
    "description": "What a token may do: `enqueue` (enqueue, cancel, retry), `claim` (claim "
    "and report tasks), `read` (tasks, listings, stats), `control` (pause, resume and limit "
    "runtimes), `admin` (everything, tokens and webhook secrets included).",
}


SCOPES_SCHEMA = {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Scope"}}


def object_schema(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": False,
    }


TOKEN_REQUEST = RawBody(
    "TokenRequest",
    "A token to create. Without runtimes it covers every runtime; an admin token "
    "always does, so it may not have any.",
    {
        **object_schema(
            ["name", "scopes"],
            {
                "name": _NAME,
                "scopes": SCOPES_SCHEMA,
                "runtimes": {**_PATTERNS, "type": ["array", "null"]},
            },
        ),
        # credentials.parse_token_spec: no runtimes beside the admin scope.
        "not": {
            "required": ["scopes", "runtimes"],
            "properties": {
                "scopes": {"contains": {"const": Scope.ADMIN.value}},
                "runtimes": {"type": "array"},
            },
        },
        "examples": [{"name": "billing-daemon", "scopes": ["claim"], "runtimes": ["billing-*"]}],
    },
)


WEBHOOK_SECRET_REQUEST = RawBody(
    "WebhookSecretRequest",
    "A webhook signing secret to create, for the runtimes it may enqueue into.",
    {
        **object_schema(["name", "runtimes"], {"name": _NAME, "runtimes": _PATTERNS}),
        "examples": [{"name": "payments-provider", "runtimes": ["payments-*"]}],
    },
)


TOKENS_QUERY = Body(
    "TokensQuery",
    "A page of tokens, oldest first.",
    (
        INCLUDE_REVOKED["include_revoked"],
        TOKENS_LIMIT,
        TOKENS_CURSOR,
    ),
)
