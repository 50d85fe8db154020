"""Tracing in the client: how a task's W3C trace context travels, and the OpenTelemetry
spans the worker loop records. OpenTelemetry stays optional: nothing of it is imported
when these modules are, only when a call could use it.

- `propagation`: a context into an enqueue (headers, or the active span's), out to a
  command's environment (TRACEPARENT, TRACESTATE), and the context the work for a task
  continues;
- `spans`: the consumer span per task that the worker loop records under the
  application's tracer provider;
- `export`: the tracer provider `gateway work` sets up for itself from OTEL_*, which
  sends its consumer spans over OTLP/HTTP.
"""
