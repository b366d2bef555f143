"""`mcp-cli bench --cold`: what a cold start costs, phase by phase.

N times: unload the model (and wait until the server has let it go), load it through the
repository API (the time from the request until READY), send the first inference (its latency at
the client, and Triton's own split of it: queue, input, infer, output, from the statistics
extension, before and after that one request), then steady state (sequential requests: p50, p99).
The runtime's own breakdown of the load (reading the .mcpir, building the onnxruntime session:
prepacking and dequantize-at-load happen there) comes from its metrics on the server's metrics
port, with the runtime's imports (numpy, onnxruntime); the rest of the load is Triton starting
the stub process and its Python (`other`). Warm-up is the
first request's latency beyond the steady p50.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from mcp_compiler.errors import ServerError, ServerUnreachableError

from .bench import Served
from .client import call
from .lifecycle import load_model, unload_model, wait_unloaded

STEADY_REQUESTS = 50


@dataclass
class ColdRun:
    load_s: float                          # load request to READY
    first_ms: float                        # the first inference after READY, at the client
    server_ms: dict[str, float]            # Triton's split of that request: queue, input, infer, output
    steady_p50_ms: float
    steady_p99_ms: float
    runtime_s: dict[str, float] | None     # the runtime's load phases: import, read, session (None: no metrics)

    @property
    def warmup_ms(self) -> float:
        return self.first_ms - self.steady_p50_ms

    @property
    def other_s(self) -> float | None:
        """The load beyond the runtime's own phases: the stub starting, its imports, Triton."""
        if not self.runtime_s:
            return None
        return self.load_s - sum(self.runtime_s.get(k, 0.0) for k in ("import", "read", "session"))

    def to_dict(self) -> dict:
        return {**asdict(self), "warmup_ms": round(self.warmup_ms, 3),
                "other_s": None if self.other_s is None else round(self.other_s, 4)}


@dataclass
class ColdReport:
    model: str
    url: str
    runs: list[ColdRun]
    notes: list[str] = field(default_factory=list)

    def median(self, key: str) -> float | None:
        vals = [v for v in (getattr(r, key) for r in self.runs) if v is not None]
        return float(np.median(vals)) if vals else None

    def to_dict(self) -> dict:
        keys = ("load_s", "first_ms", "warmup_ms", "steady_p50_ms", "steady_p99_ms", "other_s")
        return {"model": self.model, "url": self.url, "runs": [r.to_dict() for r in self.runs],
                "median": {k: self.median(k) for k in keys}, "notes": self.notes}


def cold(s: Served, runs: int = 3, metrics_url: str | None = None, progress=None,  # noqa: ANN001
         guessed: bool = False) -> ColdReport:
    """`guessed`: metrics_url is the default of a --url server (its host, port 8002), not given:
    one that cannot be read is a note, not an error."""
    notes = []
    if metrics_url is None:
        notes.append("no metrics URL: the runtime's own load phases are not shown (give --metrics-url)")
    out = []
    # one channel for the whole measurement, connected before anything is timed: the first
    # request's latency is the model's, not a TCP and HTTP/2 handshake's
    from .deploy import reload_source

    # a model deploy uploaded is not in the server's repository: it is loaded back from the copy
    # deploy kept (or not unloaded at all when there is none)
    source = reload_source(s.conn, s.name) if s.server is None else None
    c = _client(s)
    inputs = _inputs(s)
    try:
        for k in range(runs):
            unload_model(s)
            wait_unloaded(s)
            t0 = time.perf_counter()
            load_model(s, *(source or ()))
            load_s = time.perf_counter() - t0
            before = _stats(c, s)
            c.is_server_live(headers=s.conn.headers())
            t1 = time.perf_counter()
            call(s.conn, f"the first request to {s.name}", c.infer, s.name, inputs, headers=s.conn.headers())
            first_ms = (time.perf_counter() - t1) * 1e3
            after = _stats(c, s)
            deadline = time.monotonic() + 5.0   # Triton records a request's statistics after its response
            while after["count"] <= before["count"] and time.monotonic() < deadline:
                time.sleep(0.01)
                after = _stats(c, s)
            if after["count"] <= before["count"]:
                raise ServerError(f"{s.name}: the server's statistics did not count the first request")
            server = {k2: round((after[k2] - before[k2]) / 1e6, 3) for k2 in after if k2 != "count"}
            steady = []
            for _ in range(STEADY_REQUESTS):
                t = time.perf_counter()
                call(s.conn, f"a request to {s.name}", c.infer, s.name, inputs, headers=s.conn.headers())
                steady.append((time.perf_counter() - t) * 1e3)
            runtime = None
            if metrics_url:
                try:
                    runtime = _runtime_phases(metrics_url, s.name)
                except ServerUnreachableError as e:
                    if not guessed:   # a URL the user gave: its failure is theirs to see
                        raise
                    notes.append(f"{e} (the default: the --url's host, port 8002; give --metrics-url): "
                                 "no runtime phases")
                    metrics_url = None
            run = ColdRun(round(load_s, 4), round(first_ms, 3), server, round(float(np.percentile(steady, 50)), 3),
                          round(float(np.percentile(steady, 99)), 3), runtime)
            out.append(run)
            if progress is not None:
                progress(k, run)
    finally:
        c.close()
    if metrics_url and not any(r.runtime_s for r in out):
        notes.append("the server's metrics have no mcp_model_load_seconds for this model (not an mcp-cli "
                     "python-backend entry?): no runtime phases")
    return ColdReport(s.name, s.conn.describe(), out, notes)


def _client(s: Served):  # noqa: ANN202
    from .client import client

    return client(s.conn)


def _inputs(s: Served) -> list:
    import tritonclient.grpc as tg
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for k, v in s.feeds.items():
        t = tg.InferInput(k, list(v.shape), np_to_triton_dtype(v.dtype))
        t.set_data_from_numpy(v)
        inputs.append(t)
    return inputs


def _stats(c, s: Served) -> dict[str, int]:  # noqa: ANN001 - a tritonclient client
    """Triton's cumulative ns per phase for the model (all its versions)."""
    js = c.get_inference_statistics(s.name, headers=s.conn.headers(), as_json=True)
    total = {"queue": 0, "input": 0, "infer": 0, "output": 0, "count": 0}
    for m in js.get("model_stats", []):
        st = m.get("inference_stats", {})
        total["count"] += int(st.get("success", {}).get("count", 0))
        for key, name in (("queue", "queue"), ("input", "compute_input"), ("infer", "compute_infer"),
                          ("output", "compute_output")):
            total[key] += int(st.get(name, {}).get("ns", 0))
    return total


def _runtime_phases(url: str, model: str) -> dict[str, float] | None:
    """The runtime's mcp_model_load_seconds{model, phase} from the metrics endpoint."""
    from .metrics import by_model, scrape

    phases = {}
    for (name, _), m in by_model(scrape(url)).items():
        if name == model:
            phases.update(m.get("load_s", {}))
    return phases or None
