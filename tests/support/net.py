"""Loopback ports: the bench's free_port, one copy for the bench and the tests."""

from __future__ import annotations

from bench.infra import free_port

__all__ = ["free_port"]
