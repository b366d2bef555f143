"""Quantization side by side with onnxruntime's own quantizers (MatMulNBitsQuantizer, 4-bit;
quantize_dynamic, int8), in one run: on a generated transformer block stack (>= 100 MB of
FP32 weights) and on the zoo's recognition model (PP-OCRv4 rec).

    python benchmarks/bench_quantize.py [--runs 3] [--layers 6] [--quick]

Per method: quantize wall time and peak RSS (whole process, file to file, median of --runs,
methods interleaved), weight bytes of the result (initializers and Constant tensors) and the
ratio to FP32, onnxruntime CPU latency of the result (default session options, median of
repeated runs), and max-abs / cosine of its outputs against the FP32 model on the same random
inputs. Ours runs `mcp-cli convert --quantize ... --accuracy-samples 0` (the accuracy report is
measured here for every method alike, so it is left out of our timing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, measure, ort_session, versions, zoo_models
from _results import table, write_section

HERE = Path(__file__).resolve().parent
PY = sys.executable
REC_DIMS = "p2o.DynamicDimension.0=1,?=48,p2o.DynamicDimension.1=320"

ORT_NBITS = """
import sys, onnx
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
q = MatMulNBitsQuantizer(onnx.load(sys.argv[1]), bits=4, block_size=int(sys.argv[3]), is_symmetric=False,
                         accuracy_level=int(sys.argv[4]) or None)
q.process()
q.model.save_model_to_file(sys.argv[2], use_external_data_format=False)
"""
ORT_DYNAMIC = """
import sys
from onnxruntime.quantization import QuantType, quantize_dynamic
quantize_dynamic(sys.argv[1], sys.argv[2], weight_type=QuantType.QInt8)
"""


def transformer(path: Path, layers: int, d: int = 768, ffn: int = 3072, heads: int = 12, seq: int = 64) -> None:
    """`layers` pre-LN transformer blocks (attention + GELU MLP), opset 17; x: [1, seq, d]."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def w(name, *shape, scale=0.02):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def node(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    c = lambda name, v: inits.append(numpy_helper.from_array(np.asarray(v), name)) or name  # noqa: E731
    dh = d // heads
    c("shape_heads", np.array([1, seq, heads, dh], np.int64))
    c("shape_model", np.array([1, seq, d], np.int64))
    c("inv_sqrt_dh", np.array(1 / np.sqrt(dh), np.float32))
    c("half", np.array(0.5, np.float32))
    c("one", np.array(1.0, np.float32))
    c("inv_sqrt2", np.array(1 / np.sqrt(2), np.float32))
    x = "x"
    for i in range(layers):
        p = f"l{i}_"
        ln1 = node("LayerNormalization", [x, w(p + "ln1_g", d, scale=1), w(p + "ln1_b", d)], p + "ln1", axis=-1)
        qkv = []
        for t in "qkv":
            mm = node("MatMul", [ln1, w(p + f"w{t}", d, d)], p + f"{t}_mm")
            b = node("Add", [mm, w(p + f"b{t}", d)], p + f"{t}_b")
            r = node("Reshape", [b, "shape_heads"], p + f"{t}_r")
            qkv.append(node("Transpose", [r], p + f"{t}_t", perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]))
        s = node("MatMul", qkv[:2], p + "scores")
        s = node("Mul", [s, "inv_sqrt_dh"], p + "scaled")
        a = node("Softmax", [s], p + "attn", axis=-1)
        o = node("MatMul", [a, qkv[2]], p + "ctx")
        o = node("Transpose", [o], p + "ctx_t", perm=[0, 2, 1, 3])
        o = node("Reshape", [o, "shape_model"], p + "ctx_r")
        o = node("Add", [node("MatMul", [o, w(p + "wo", d, d)], p + "o_mm"), w(p + "bo", d)], p + "o")
        x = node("Add", [x, o], p + "res1")
        ln2 = node("LayerNormalization", [x, w(p + "ln2_g", d, scale=1), w(p + "ln2_b", d)], p + "ln2", axis=-1)
        h = node("Add", [node("MatMul", [ln2, w(p + "w1", d, ffn)], p + "ff1_mm"), w(p + "b1", ffn)], p + "ff1")
        erf = node("Erf", [node("Mul", [h, "inv_sqrt2"], p + "gelu_s")], p + "gelu_erf")
        g = node("Mul", [node("Mul", [h, "half"], p + "gelu_h"), node("Add", [erf, "one"], p + "gelu_1")], p + "gelu")
        f = node("Add", [node("MatMul", [g, w(p + "w2", ffn, d)], p + "ff2_mm"), w(p + "b2", d)], p + "ff2")
        x = node("Add", [x, f], p + "res2")
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(nodes, "blocks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def weight_bytes(path: Path) -> int:
    if path.suffix == ".mcpir":
        from mcp_compiler.mcpir.reader import read_mcpir

        return sum(t.nbytes for t in read_mcpir(path).tensors())
    m = onnx.load(path)
    total = sum(len(t.raw_data) or numpy_helper.to_array(t).nbytes for t in m.graph.initializer)
    for n in m.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                total += numpy_helper.to_array(a.t).nbytes
    return total


def evaluate(path: Path, feeds: list[dict], reference: list[list[np.ndarray]] | None, reps: int):
    sess = ort_session(path)
    outs = [sess.run(None, f) for f in feeds]
    sess.run(None, feeds[0])
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sess.run(None, feeds[0])
        times.append(time.perf_counter() - t0)
    lat = statistics.median(times) * 1e3
    if reference is None:
        return outs, lat, 0.0, 1.0
    a = np.concatenate([np.asarray(o, np.float64).ravel() for r in reference for o in r])
    b = np.concatenate([np.asarray(o, np.float64).ravel() for r in outs for o in r])
    return outs, lat, float(np.abs(a - b).max()), float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def methods(src: Path, out: Path, extra: list[str]) -> dict[str, tuple[list[str], Path]]:
    ours = [PY, "-m", "mcp_compiler.cli", "convert", "-i", str(src), "--accuracy-samples", "0", *extra]

    def mine(tag, *flags):
        return ([*ours, "-o", str(out / f"{tag}.mcpir"), *flags], out / f"{tag}.mcpir")

    return {
        "mcp-cli int4 g32": mine("int4_g32", "--quantize", "int4", "--group-size", "32"),
        "ORT MatMulNBits g32": ([PY, "-c", ORT_NBITS, str(src), str(out / "nbits32.onnx"), "32", "0"], out / "nbits32.onnx"),
        "mcp-cli int4 g128": mine("int4_g128", "--quantize", "int4", "--group-size", "128"),
        "ORT MatMulNBits g128": ([PY, "-c", ORT_NBITS, str(src), str(out / "nbits128.onnx"), "128", "0"], out / "nbits128.onnx"),
        "mcp-cli int4 g32 acc4": mine("int4_g32_acc4", "--quantize", "int4", "--int4-accuracy-level", "4"),
        "ORT MatMulNBits g32 acc4": ([PY, "-c", ORT_NBITS, str(src), str(out / "nbits32a4.onnx"), "32", "4"], out / "nbits32a4.onnx"),
        "mcp-cli int4 g32 qdq": mine("int4_qdq", "--quantize", "int4", "--int4-format", "qdq"),
        "mcp-cli fp8 e4m3fn": mine("fp8", "--quantize", "fp8"),
        "ORT quantize_dynamic int8": ([PY, "-c", ORT_DYNAMIC, str(src), str(out / "dyn8.onnx")], out / "dyn8.onnx"),
    }


def bench(label: str, src: Path, out: Path, feeds: list[dict], runs: int, reps: int, extra: list[str]) -> list[list]:
    ms = methods(src, out, extra)
    walls: dict[str, list] = {k: [] for k in ms}
    for _ in range(runs):                      # interleaved: noise hits every method alike
        for name, (cmd, _) in ms.items():
            walls[name].append(measure(cmd))
    ref_outs, ref_lat, _, _ = evaluate(src, feeds, None, reps)
    fp32 = weight_bytes(src)
    rows = [[label, "FP32 original", "", "", f"{fp32 / 2**20:.1f}", "1.000", f"{ref_lat:.2f}", "1.00", "0", "1"]]
    for name, (_, path) in ms.items():
        rs = walls[name]
        if any(r.rc != 0 for r in rs) or not path.exists():
            rows.append([label, name, "failed", "", "", "", "", "", "", ""])
            continue
        wb = weight_bytes(path)
        _, lat, mad, cos = evaluate(path, feeds, ref_outs, reps)
        rows.append([label, name, f"{statistics.median(r.wall for r in rs):.2f}",
                     f"{statistics.median(r.rss_mb for r in rs):.0f}", f"{wb / 2**20:.1f}", f"{wb / fp32:.3f}",
                     f"{lat:.2f}", f"{lat / ref_lat:.2f}", f"{mad:.4g}", f"{cos:.6f}"])
        print(" | ".join(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="one small block, one run; nothing written")
    args = ap.parse_args()
    layers, runs, reps = (1, 1, 3) if args.quick else (args.layers, args.runs, args.reps)
    rng = np.random.default_rng(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mcp-bench-q-") as tmp:
        tmp = Path(tmp)
        src = tmp / "blocks.onnx"
        transformer(src, layers)
        feeds = [{"x": rng.standard_normal((1, 64, 768)).astype(np.float32)} for _ in range(4)]
        rows += bench(f"transformer x{layers}", src, tmp, feeds, runs, reps, [])
        if not args.quick:
            out = tmp / "rec"
            out.mkdir()
            feeds = [{"x": rng.random((1, 3, 48, 320), dtype=np.float32)} for _ in range(4)]
            rows += bench("ppocrv4_rec", zoo_models("ppocrv4_rec")[0][1], out, feeds, runs, reps,
                          ["--quantize-min-elements", "1024", "--dims", REC_DIMS])
    header = ["model", "method", "quantize s", "peak RSS MB", "weights MB", "x FP32", "ORT latency ms",
              "x FP32 latency", "max abs vs FP32", "cosine vs FP32"]
    body = (f"`python benchmarks/bench_quantize.py --runs {runs} --layers {layers}` - {machine()}; "
            f"{', '.join(f'{k} {v}' for k, v in versions().items())}.\n\n"
            "Quantize time and RSS: whole process, file to file, median of the runs (methods "
            "interleaved). Latency: onnxruntime CPU, default session options, batch 1, median of "
            f"{reps} runs. Error: all outputs of 4 random inputs against the FP32 model.\n\n"
            + table(header, rows))
    print(body)
    if not args.quick:
        write_section("quantize", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
