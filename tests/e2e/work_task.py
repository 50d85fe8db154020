"""The command the `gateway work` tests run for each task. The payload says what to do:
`pidfile` (write our pid there first), `sleep` (seconds, on attempt `sleep_on_attempt`,
default every attempt), `fail` (exit 7 after 5,000 bytes of stderr and a marker),
`trace_child` (make a span, a child of TRACEPARENT, sent over OTLP/HTTP)."""

import json
import os
import sys
import time

payload = json.load(sys.stdin)
attempt = int(os.environ["GATEWAY_TASK_ATTEMPT"])
if payload.get("pidfile"):
    with open(payload["pidfile"], "w") as f:
        f.write(str(os.getpid()))
if payload.get("sleep") and payload.get("sleep_on_attempt", attempt) == attempt:
    time.sleep(payload["sleep"])
if payload.get("trace_child"):
    # A traced command: a span of its own, a child of the context gateway work gave it
    # (TRACEPARENT), sent over OTLP/HTTP where the worker's variables say.
    from opentelemetry import propagate
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource({"service.name": "the-command"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    context = propagate.extract({"traceparent": os.environ["TRACEPARENT"]})
    with provider.get_tracer("work_task").start_as_current_span("command work", context=context):
        pass
    provider.shutdown()
if payload.get("fail"):
    sys.stderr.write("x" * 5000 + "\nfailed on purpose: " + str(payload["n"]))
    sys.exit(7)
print(
    json.dumps(
        {
            "n": payload.get("n"),
            "task_id": os.environ["GATEWAY_TASK_ID"],
            "runtime": os.environ["GATEWAY_RUNTIME"],
            "attempt": attempt,
            "token_withheld": "GATEWAY_TOKEN" not in os.environ,
            "traceparent": os.environ.get("TRACEPARENT"),
            "tracestate": os.environ.get("TRACESTATE"),
        }
    )
)
