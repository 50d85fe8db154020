"""Calls with a misspelt keyword, which mypy must refuse (test_typing.py runs it and
finds each by its keyword)."""

from gateway_client import Client


def misspelt() -> None:
    with Client() as gw:
        gw.enqueue("demo", {"n": 1}, priorty=90)
        gw.claim("demo", "me", wait_second=20)
