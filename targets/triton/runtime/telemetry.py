"""The served model's own spans, through the OpenTelemetry SDK, under the server's.

`mcp-cli serve --trace otlp=URL` sets Triton's OpenTelemetry trace mode and, for the stubs it
starts, MCP_TRACE_OTLP=URL (MCP_TRACE_FILE=PATH for `--trace file=PATH`). With neither set, or
without the OpenTelemetry SDK importable, `Telemetry.create` returns None and nothing is traced.

Each request that Triton sampled carries its trace context (request.trace().get_context(), W3C
traceparent); the runtime's spans - `mcp.decode_inputs`, `mcp.onnxruntime.run`,
`mcp.encode_outputs` - are its children, with the model's name and version. At load, one root
span `mcp.load` holds `mcp.read_model` and `mcp.create_session` (dequantize-at-load happens in
the session's creation). Spans are handed to a BatchSpanProcessor: exporting runs on its own
thread and never blocks a request; spans a slow or dead collector does not take are dropped
and counted (`dropped`).
"""

from __future__ import annotations

import json
import os
import threading


class _Counting:
    """Wraps the exporter: counts spans exported and spans dropped (a failed export)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.exported = self.dropped = 0
        self.lock = threading.Lock()

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.inner.export(spans)
        except Exception:  # noqa: BLE001 - a collector's failure is a drop, never the request's
            result = SpanExportResult.FAILURE
        with self.lock:
            if result == SpanExportResult.SUCCESS:
                self.exported += len(spans)
            else:
                self.dropped += len(spans)
        return result

    def shutdown(self):
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000):
        return getattr(self.inner, "force_flush", lambda *a: True)(timeout_millis)


class _JsonLines:
    """A span exporter writing one JSON object per span (MCP_TRACE_FILE)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        with self.lock, open(self.path, "a", encoding="utf-8") as f:
            for s in spans:
                f.write(json.dumps(json.loads(s.to_json()), separators=(",", ":")) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


class Telemetry:
    def __init__(self, tracer, provider, exporter: _Counting, attributes: dict, rate: int = 0) -> None:
        self.tracer, self.provider, self.exporter, self.attributes = tracer, provider, exporter, attributes
        # Triton's own trace file (mode triton) gives requests no trace context: the runtime then
        # samples 1 in `rate` itself and roots each request's spans at an `mcp.request` span
        self.rate, self.seen = rate, 0

    @classmethod
    def create(cls, model: str, version: str):
        otlp, path = os.environ.get("MCP_TRACE_OTLP"), os.environ.get("MCP_TRACE_FILE")
        if not otlp and not path:
            return None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            return None   # the trace extra is missing in the server's Python: Triton's spans only
        if otlp:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            inner = OTLPSpanExporter(endpoint=otlp, timeout=2)
        else:
            inner = _JsonLines(path + ".runtime.jsonl")
        attributes = {"mcp.model": model, "mcp.model_version": version}
        resource = Resource.create({"service.name": os.environ.get("MCP_TRACE_SERVICE", "mcp-cli"),
                                    "mcp_cli.version": os.environ.get("MCP_CLI_VERSION", "?"), **attributes})
        provider = TracerProvider(resource=resource)
        exporter = _Counting(inner)
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=4096, schedule_delay_millis=500,
                                                       export_timeout_millis=3000))
        rate = 0 if otlp else max(1, int(os.environ.get("MCP_TRACE_RATE", "1") or 1))
        return cls(provider.get_tracer("mcp_runtime"), provider, exporter, attributes, rate)

    def load(self, start_ns: int, phases: list[tuple[str, int, int]]) -> None:
        """The load: a root span, one child per (name, start, end) phase."""
        from opentelemetry import trace

        root = self.tracer.start_span("mcp.load", start_time=start_ns, attributes=self.attributes)
        ctx = trace.set_span_in_context(root)
        for name, t0, t1 in phases:
            self.tracer.start_span(name, context=ctx, start_time=t0, attributes=self.attributes).end(end_time=t1)
        root.end(end_time=max(t1 for _, _, t1 in phases) if phases else None)

    def request(self, trace_context: str | None, phases: list[tuple[str, int, int]], batch: int) -> None:
        """One request's spans, children of the server's span in `trace_context` (Triton's JSON
        carrier: {"traceparent": ...}); nothing when Triton did not sample the request."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attrs = {**self.attributes, "mcp.batch_requests": batch}
        try:
            carrier = json.loads(trace_context) if trace_context else None
        except ValueError:
            carrier = None
        root = None
        if isinstance(carrier, dict) and "traceparent" in carrier:
            ctx = TraceContextTextMapPropagator().extract(carrier)
        elif self.rate:
            self.seen += 1
            if (self.seen - 1) % self.rate:
                return
            root = self.tracer.start_span("mcp.request", start_time=phases[0][1], attributes=attrs)
            ctx = trace.set_span_in_context(root)
        else:
            return   # Triton did not sample this request
        for name, t0, t1 in phases:
            self.tracer.start_span(name, context=ctx, start_time=t0, attributes=attrs).end(end_time=t1)
        if root is not None:
            root.end(end_time=phases[-1][2])

    def shutdown(self) -> None:
        self.provider.shutdown()


def trace_context(request) -> str | None:
    """The request's trace context as Triton gives it (None when it has none)."""
    try:
        t = request.trace()
        return t.get_context() if t is not None else None
    except Exception:  # noqa: BLE001 - an older python backend: no trace API
        return None
