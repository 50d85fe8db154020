"""When `gateway work` sets up span export from the OTEL_* variables, and when it
declines (with a warning that says why, when it was asked). That the spans it sets up
reach an OTLP/HTTP receiver is tested against a real gateway, in
tests/e2e/test_work_spans.py."""

from __future__ import annotations

import logging
import sys

import pytest

from gateway_client.tracing.export import export_asked, exporting_provider

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize(
    ("env", "asked"),
    [
        ({}, False),
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),  # to the exporter's default endpoint
        ({"OTEL_TRACES_EXPORTER": "console, OTLP"}, True),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ],
)
def test_export_is_asked_for_by_an_endpoint_or_the_otlp_exporter(
    env: dict[str, str], asked: bool
) -> None:
    assert export_asked(env) is asked


def test_nothing_is_set_up_when_export_is_not_asked_for() -> None:
    assert exporting_provider({}) is None


def test_a_grpc_protocol_is_declined_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    env = {**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with caplog.at_level(logging.WARNING, "gateway_client"):
        assert exporting_provider(env) is None
    assert "OTEL_EXPORTER_OTLP_PROTOCOL asks for grpc" in caplog.text


def test_without_the_exporter_a_warning_says_what_to_install(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with caplog.at_level(logging.WARNING, "gateway_client"):
        assert exporting_provider(ENDPOINT) is None
    assert "claim-gateway-client[otel]" in caplog.text
