"""A local OTLP/HTTP relay between a served model and the user's collector.

Triton's OpenTelemetry exporter (tritonserver 2.51) and the runtime's exporter both send to this
relay on 127.0.0.1, which answers at once and forwards each batch to the collector from its own
thread. A slow or dead collector then costs neither a request nor the server: batches that
cannot be forwarded in time (or that find the relay's queue full) are dropped and counted. CI
saw tritonserver crash (SIGSEGV) while its exporter sent every request's spans to a closed
port; with the relay it never talks to anything that does not answer.
"""

from __future__ import annotations

import contextlib
import http.server
import queue
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

HOST = "127.0.0.1"
MAX_BODY = 16 << 20        # bytes one export may carry (Triton batches at most 512 spans)
QUEUE = 1024               # batches waiting for the collector before new ones are dropped
FORWARD_TIMEOUT = 2.0      # seconds for the collector to take one batch


@dataclass
class RelayStats:
    received: int = 0      # batches the exporters sent
    forwarded: int = 0     # batches the collector took
    dropped: int = 0       # batches lost: the collector failed or was too slow, or the queue was full
    last_error: str = ""


class TraceRelay:
    """Receives OTLP/HTTP exports on 127.0.0.1 (`url`) and forwards them to `target`."""

    def __init__(self, target: str, *, queue_size: int = QUEUE, timeout: float = FORWARD_TIMEOUT) -> None:
        self.target, self.timeout = target, timeout
        self.stats = RelayStats()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._forwarder: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the relay is not started"
        return f"http://{HOST}:{self._server.server_address[1]}/v1/traces"

    def start(self) -> TraceRelay:
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:   # its counts, in Prometheus' text format
                if self.path.rstrip("/") != "/metrics":
                    self.send_response(404)
                    self.end_headers()
                    return
                body = relay.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length <= 0 or length > MAX_BODY:
                    self.send_response(413 if length > MAX_BODY else 400)
                    self.end_headers()
                    return
                body = self.rfile.read(length)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() in ("content-type", "content-encoding")}
                relay._take(body, headers)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:   # no per-request lines on stderr
                pass

        self._server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="mcp-trace-relay", daemon=True).start()
        self._forwarder = threading.Thread(target=self._forward, name="mcp-trace-forward", daemon=True)
        self._forwarder.start()
        return self

    def _take(self, body: bytes, headers: dict[str, str]) -> None:
        with self._lock:
            self.stats.received += 1
        try:
            self._queue.put_nowait((body, headers))
        except queue.Full:
            self._drop("the relay's queue is full: the collector is slower than the spans")

    def _drop(self, why: str) -> None:
        with self._lock:
            self.stats.dropped += 1
            self.stats.last_error = why

    def _forward(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            body, headers = item
            req = urllib.request.Request(self.target, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    r.read()
                with self._lock:
                    self.stats.forwarded += 1
            except urllib.error.HTTPError as e:
                self._drop(f"the collector answered {e.code}")
            except (urllib.error.URLError, OSError, ValueError) as e:
                reason = getattr(e, "reason", e)
                self._drop(f"the collector is unreachable: {reason}")

    def close(self, drain: float = 2.0) -> None:
        """Stop receiving; forward what is queued for at most `drain` seconds more."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=drain)
        self._forwarder.join(drain)
        while True:   # what could not be forwarded in time is dropped
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._drop("the server stopped before the collector took it")
        self._server = None

    @property
    def metrics_url(self) -> str:
        return self.url.replace("/v1/traces", "/metrics")

    def metrics(self) -> str:
        s = self.stats
        lines = []
        for name, value, what in (("received", s.received, "OTLP export batches the exporters sent"),
                                  ("forwarded", s.forwarded, "batches the collector took"),
                                  ("dropped", s.dropped, "batches lost: the collector failed, was too slow, "
                                                         "or the queue was full")):
            lines += [f"# HELP mcp_trace_relay_batches_{name} {what}", f"# TYPE mcp_trace_relay_batches_{name} counter",
                      f"mcp_trace_relay_batches_{name} {value}"]
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        s = self.stats
        batches = "batch" if s.received == 1 else "batches"
        line = f"trace relay: {s.received} {batches} received, {s.forwarded} forwarded to {self.target}, {s.dropped} dropped"
        return line + (f" (last: {s.last_error})" if s.dropped and s.last_error else "")
