"""Triton's Prometheus metrics endpoint, read for `status --metrics` and `bench --cold`: Triton's
own per-model counters and the mcp-cli runtime's custom metrics (runtime/model.py)."""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from collections import defaultdict

from mcp_compiler.errors import ServerUnreachableError

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# name -> what `status --metrics` calls it (Triton's counters; durations are cumulative µs)
TRITON = {"nv_inference_request_success": "success", "nv_inference_request_failure": "failure",
          "nv_inference_count": "inferences", "nv_inference_exec_count": "executions",
          "nv_inference_request_duration_us": "request_us", "nv_inference_queue_duration_us": "queue_us",
          "nv_inference_compute_infer_duration_us": "infer_us"}


URL_LIMIT = 2048


def http_url(value: str, flag: str) -> str:
    """An http(s) URL given on the command line, checked whole before it is used: printable
    ASCII (no spaces or newlines), a scheme of http or https (`http://` added to HOST:PORT), a
    host, a port that parses, no credentials (never echoed back). One usage line naming `flag`
    otherwise (`file:///etc/passwd`, `javascript:`, `http://[::1`)."""
    from urllib.parse import urlsplit

    from mcp_compiler.errors import UsageError

    text = value.strip()
    if len(text) > URL_LIMIT:
        raise UsageError(f"{flag}: {len(text):,} characters, more than a URL here may be ({URL_LIMIT})")
    if not text or not text.isascii() or any(ord(c) < 33 or ord(c) == 127 or c in "{}\\\"'<>`" for c in text):
        raise UsageError(f"{flag}: expected http://HOST:PORT (printable ASCII, no spaces or newlines, no quotes, "
                         "braces or backslashes)")
    text = text if "://" in text else f"http://{text}"
    try:
        parts = urlsplit(text)
        parts.port   # noqa: B018 - raises on a port that is no number
    except ValueError:
        raise UsageError(f"{flag}: expected http://HOST:PORT, e.g. http://127.0.0.1:8002") from None
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"{flag}: expected an http:// or https:// URL with a host, got scheme {parts.scheme!r}")
    if not parts.hostname:
        raise UsageError(f"{flag}: expected http://HOST:PORT (no host given)")
    if parts.username or parts.password:
        raise UsageError(f"{flag}: credentials in the URL are not accepted")
    return text


def metrics_url(url: str) -> str:
    """http://HOST:PORT/metrics from HOST:PORT, http://HOST:PORT or the full URL (http_url's rules)."""
    text = http_url(url, "--metrics-url")
    return text if text.rstrip("/").endswith("/metrics") else text.rstrip("/") + "/metrics"


def scrape(url: str, timeout: float = 10.0) -> list[tuple[str, dict[str, str], float]]:
    url = metrics_url(url)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read(64 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        raise ServerUnreachableError(f"Triton's metrics at {url} answered HTTP {e.code}: not its metrics port? "
                                     "(--metrics-url http://HOST:8002, as `serve` prints it)") from None
    except (OSError, ValueError) as e:
        raise ServerUnreachableError(f"cannot read Triton's metrics at {url}: {e} (its metrics port: "
                                     "--metrics-url http://HOST:8002, as `serve` prints it)") from None
    out = []
    for line in body.splitlines():
        m = _LINE.match(line)
        if m and not line.startswith("#"):
            try:
                value = float(m.group(3))
            except ValueError:
                continue
            if math.isfinite(value):   # a NaN or 1e400 counter is no count: left out
                out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def by_model(samples: list[tuple[str, dict[str, str], float]]) -> dict[tuple[str, str], dict]:
    """(model, version) -> Triton's counters and the runtime's metrics for it."""
    out: dict[tuple[str, str], dict] = defaultdict(dict)
    for name, labels, value in samples:
        model = labels.get("model")
        if model is None:
            continue
        key = (model, labels.get("version", ""))
        if name in TRITON:
            out[key][TRITON[name]] = value
        elif name == "mcp_model_load_seconds":
            out[key].setdefault("load_s", {})[labels.get("phase", "?")] = value
        elif name == "mcp_runtime_errors_total":
            out[key]["runtime_errors"] = value
        elif name == "mcp_trace_spans_dropped":
            out[key]["spans_dropped"] = value
    return dict(out)


def summary(m: dict) -> dict:
    """The main figures of one model version: requests, averages in ms, the runtime's load."""
    # Triton counts an error response of the python backend as a success: the runtime's own count
    # of the requests it failed moves them to the failures
    errors = m.get("runtime_errors") or 0.0
    served, execs = m.get("success", 0.0), m.get("executions", 0.0)
    ok = max(served - errors, 0.0)
    avg = lambda k: round(m[k] / served / 1e3, 3) if served and k in m else None  # noqa: E731
    return {"success": int(ok), "failure": int(m.get("failure", 0) + min(errors, served)),
            "avg_batch": round(m.get("inferences", 0) / execs, 2) if execs else None,
            "avg_request_ms": avg("request_us"), "avg_queue_ms": avg("queue_us"), "avg_infer_ms": avg("infer_us"),
            "load_s": m.get("load_s"), "runtime_errors": m.get("runtime_errors"),
            "spans_dropped": m.get("spans_dropped")}
