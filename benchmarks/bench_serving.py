"""Serving on a real local Triton: throughput and p50/p99 at concurrency 16, dynamic batching on
vs off vs onnxruntime in-process; and cold start (load request -> READY), .mcpir vs model.onnx.

    python benchmarks/bench_serving.py [--runs 3] [--seconds 6] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, versions
from _results import table, write_section

from mcp_compiler import CompileOptions, compile_model
from mcp_compiler.targets.triton.serve import TritonServer

CONCURRENCY = 16


def make_mlp(path: Path, d_in: int = 256, hidden: int = 1024, layers: int = 3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    nodes, inits, prev, width = [], [], "x", d_in
    for i in range(layers):
        out = 10 if i == layers - 1 else hidden
        inits += [numpy_helper.from_array((rng.standard_normal((width, out)) / np.sqrt(width)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(np.zeros(out, np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        prev = f"a{i}"
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
        width = out
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d_in])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def load(run_one, seconds: float) -> tuple[float, float, float]:
    """CONCURRENCY threads, each sending batch-1 requests for `seconds`: (req/s, p50 ms, p99 ms)."""
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def worker(k: int) -> None:
        call = run_one(k)
        x = np.random.default_rng(k).standard_normal((1, 256)).astype(np.float32)
        mine = []
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            call(x)
            mine.append(time.perf_counter() - t0)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(CONCURRENCY)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    return len(lat) / wall, lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


def grpc_caller(url: str, name: str):
    import tritonclient.grpc as tg

    def make(_k: int):
        c = tg.InferenceServerClient(url)

        def call(x):
            i = tg.InferInput("x", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            return c.infer(name, [i]).as_numpy("y")
        return call
    return make


def ort_caller(src: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    sess = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return lambda _k: (lambda x: sess.run(None, {"x": x})[0])


ONNX_MODEL_PY = '''
import json, os
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
HERE = os.path.dirname(os.path.abspath(__file__))
class TritonPythonModel:
    def initialize(self, args):
        self.sess = ort.InferenceSession(os.path.join(HERE, "model.onnx"), providers=["CPUExecutionProvider"])
    def execute(self, requests):
        out = []
        for r in requests:
            feeds = {i.name: pb_utils.get_input_tensor_by_name(r, i.name).as_numpy() for i in self.sess.get_inputs()}
            res = self.sess.run(None, feeds)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(o.name, v) for o, v in zip(self.sess.get_outputs(), res)]))
        return out
'''


def cold_start(srcs: list[tuple[str, Path]], runs: int, work: Path) -> list[list]:
    """Median seconds from a load request to READY: python backend on .mcpir (our runtime) vs a
    python backend whose model.py opens model.onnx with onnxruntime directly."""
    import tritonclient.http as th

    repo = work / "cold_repo"
    repo.mkdir()
    rows = []
    for label, src in srcs:
        compile_model(src, repo, CompileOptions.for_target("triton-v1.12", f"{label}_mcpir",
                                                           settings={"dynamic_batch": False}))
        # the peer: same config, model.py loading the original .onnx
        peer = repo / f"{label}_onnx"
        (peer / "1").mkdir(parents=True)
        (peer / "1" / "model.py").write_text(ONNX_MODEL_PY)
        (peer / "1" / "model.onnx").write_bytes(src.read_bytes())
        cfg = (repo / f"{label}_mcpir" / "config.pbtxt").read_text().replace(f"{label}_mcpir", f"{label}_onnx")
        (peer / "config.pbtxt").write_text(cfg)
    with TritonServer(repo, explicit=True) as s:
        c = th.InferenceServerClient(s.http_url, network_timeout=120)
        for label, src in srcs:
            times = {}
            for kind in ("mcpir", "onnx"):
                name = f"{label}_{kind}"
                ts = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    c.load_model(name)
                    while not c.is_model_ready(name):
                        time.sleep(0.005)
                    ts.append(time.perf_counter() - t0)
                    c.unload_model(name)
                    while c.is_model_ready(name):
                        time.sleep(0.01)
                    time.sleep(0.3)
                times[kind] = statistics.median(ts)
            mb = sum(t.nbytes for t in _weights(src)) / 2**20
            rows.append([label, f"{mb:.1f}", f"{times['mcpir']:.3f}", f"{times['onnx']:.3f}",
                         f"{times['mcpir'] / times['onnx']:.2f}"])
            print(rows[-1], flush=True)
        c.close()
    return rows


def _weights(src: Path):
    from mcp_compiler.frontend import load_onnx

    return list(load_onnx(src, check=False, infer_shapes=False).model.tensors())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="alternating runs of each serving setup")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.seconds = 1, 2.0
    with tempfile.TemporaryDirectory(prefix="mcp-bench-serving-") as d:
        work = Path(d)
        src = work / "mlp.onnx"
        make_mlp(src)
        repo = work / "repo"
        compile_model(src, repo, CompileOptions.for_target("triton-v1.12", "mlp_db", settings={
            "max_batch_size": 32, "max_queue_delay_us": 500, "preferred_batch_size": []}))
        compile_model(src, repo, CompileOptions.for_target("triton-v1.12", "mlp_nodb",
                                                           settings={"dynamic_batch": False}))
        results: dict[str, list] = {"triton, dynamic batching (max 32, 500 us)": [],
                                    "triton, no dynamic batching": [], "onnxruntime in-process": []}
        with TritonServer(repo) as s:
            callers = {"triton, dynamic batching (max 32, 500 us)": grpc_caller(s.grpc_url, "mlp_db"),
                       "triton, no dynamic batching": grpc_caller(s.grpc_url, "mlp_nodb"),
                       "onnxruntime in-process": ort_caller(src)}
            for k in callers:  # warm up
                load(callers[k], 0.5)
            for _ in range(args.runs):
                for k, c in callers.items():
                    results[k].append(load(c, args.seconds))
                    print(k, results[k][-1], flush=True)
        rows = []
        base = statistics.median(r[0] for r in results["triton, no dynamic batching"])
        base_p99 = statistics.median(r[2] for r in results["triton, no dynamic batching"])
        for k, rs in results.items():
            rps, p50, p99 = (statistics.median(r[i] for r in rs) for i in range(3))
            rows.append([k, f"{rps:,.0f}", f"{p50:.2f}", f"{p99:.2f}", f"{rps / base:.2f}", f"{p99 / base_p99:.2f}"])
        big = work / "mlp_big.onnx"
        make_mlp(big, d_in=2048, hidden=4096, layers=4)  # 160 MiB of weights
        cold = cold_start([("mlp_small", src), ("mlp_160mb", big)], 1 if args.quick else 5, work)
    body = "\n\n".join([
        "## Serving on the local Triton (python backend, MCP-IR runtime)",
        f"Written by `python benchmarks/bench_serving.py --runs {args.runs} --seconds {args.seconds}`. "
        f"Machine: {machine()}. Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items())
        + ". tritonserver 2.51 (nvidia-pytriton 0.7.0), CPU.",
        f"MLP 256-1024-1024-10 (FP32), {CONCURRENCY} concurrent gRPC clients in one Python process, "
        f"batch-1 requests, {args.seconds:.0f} s per run, median of {args.runs} alternating runs. "
        "The in-process row: the same 16 threads calling one InferenceSession. Client and server "
        "share the 2 cores, so absolute rates are low; the ratios are the point.",
        table(["setup", "req/s", "p50 ms", "p99 ms", "req/s vs no batching", "p99 vs no batching"], rows),
        "## Cold start on Triton: load request to READY",
        "Explicit model control; `load_model` until `is_model_ready`, median of "
        f"{1 if args.quick else 5} load/unload cycles. `mcpir`: our python backend (mmap, runtime "
        "lowering, weights read by onnxruntime as external data inside the .mcpir); `onnx`: a "
        "python backend whose model.py opens model.onnx with onnxruntime. Both include starting "
        "the python stub process.",
        table(["model", "weights MB", "mcpir s", "onnx s", "mcpir/onnx"], cold),
    ])
    if not args.quick:
        write_section("serving", body)
    print(body)


if __name__ == "__main__":
    main()
