"""Reading the Prefer request header (RFC 7240) for `return=minimal`."""

from __future__ import annotations

import pytest

from gateway.http.io import prefers_minimal


@pytest.mark.parametrize(
    ("headers", "minimal"),
    [
        (["return=minimal"], True),
        ([], False),
        (["return=representation"], False),
        (["respond-async, return=minimal"], True),
        (["RETURN = MINIMAL"], True),
        (["  respond-async ,wait=10,  Return=Minimal ; foo=bar"], True),
        (['return="minimal"'], True),
        ([",,return=minimal,,"], True),
        (["handling=lenient", "return=minimal"], True),  # several headers: one list
        # Of several `return` preferences, the first counts (RFC 7240, section 2).
        (["return=representation, return=minimal"], False),
        (["return=representation", "return=minimal"], False),
        # A comma or `return=` inside a quoted value separates nothing.
        (['foo="a,return=minimal"'], False),
        (['foo="a\\"b,c", return=minimal'], True),
        (['foo="open, return=minimal'], False),
        # Parameters after `;` belong to their preference.
        (["x; return=minimal"], False),
        (["return=minimal;x=1"], True),
        (["return"], False),
        (["return=minimalist"], False),
        (["return=, minimal"], False),
        (["minimal"], False),
    ],
)
def test_prefer_return_minimal(headers: list[str], minimal: bool) -> None:
    assert prefers_minimal(headers) is minimal
