"""The pass pipeline side by side with onnxslim, onnxsim and onnxruntime's own offline
optimization (ORT_ENABLE_BASIC), in one run: node counts after, conversion wall time and peak
RSS, and onnxruntime CPU latency of each output; and time growth from a 5k- to a 50k-node graph.

    python benchmarks/bench_passes.py [--runs 3] [--quick]

Models: the zoo (PP-OCRv4 det/rec, PP-OCR cls), onnx's light models, a generated BERT-style
encoder (layer norm and GELU written out, opset 14), and generated graphs of conv blocks
(Conv -> BatchNormalization -> exported hard-swish -> Identity, ~5k and ~50k nodes).
Ours is `mcp-cli convert --target triton-v1.12` (checker, shape inference, the default
pipeline, legalization, .mcpir and repository); peers write an optimized .onnx. Latency: batch
1, one onnxruntime session per output (default optimizations, one intra-op thread), median of
--reps runs taken in turns.
"""

from __future__ import annotations

import argparse
import shutil
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
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
PY = sys.executable
TIMEOUT = 120.0
ZOO_INPUTS = {"ch_PP-OCRv4_det_infer": (1, 3, 64, 96), "ch_PP-OCRv4_rec_infer": (1, 3, 48, 320),
              "ch_ppocr_mobile_v2.0_cls_infer": (1, 3, 48, 192), "encoder": (1, 128, 256)}
ONNXSIM = "import sys, onnx, onnxsim\nm, ok = onnxsim.simplify(onnx.load(sys.argv[1]))\nonnx.save(m, sys.argv[2])\n"
ORT_BASIC = ("import sys, onnxruntime as ort\nso = ort.SessionOptions()\n"
             "so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC\n"
             "so.optimized_model_filepath = sys.argv[2]\n"
             "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])\n")


def conv_blocks(path: Path, nodes: int, c: int = 8) -> None:
    """Blocks of Conv(1x1) -> BatchNormalization -> x * Clip(x + 3, 0, 6) / 6 -> Identity."""
    rng = np.random.default_rng(0)
    ns, inits = [], []
    for name, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0)):
        inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
    x = "x"
    for i in range(nodes // 7):
        p = f"b{i}_"
        inits += [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.3).astype(np.float32), p + "w"),
                  numpy_helper.from_array(rng.random(c).astype(np.float32) + 0.5, p + "g"),
                  numpy_helper.from_array(rng.standard_normal(c).astype(np.float32) * 0.1, p + "b"),
                  numpy_helper.from_array(rng.standard_normal(c).astype(np.float32) * 0.1, p + "m"),
                  numpy_helper.from_array(rng.random(c).astype(np.float32) + 0.5, p + "v")]
        ns += [helper.make_node("Conv", [x, p + "w"], [p + "c"]),
               helper.make_node("BatchNormalization", [p + "c", p + "g", p + "b", p + "m", p + "v"], [p + "bn"]),
               helper.make_node("Add", [p + "bn", "three"], [p + "a"]),
               helper.make_node("Clip", [p + "a", "zero", "six"], [p + "k"]),
               helper.make_node("Mul", [p + "bn", p + "k"], [p + "hm"]),
               helper.make_node("Div", [p + "hm", "six"], [p + "hs"]),
               helper.make_node("Identity", [p + "hs"], [p + "o"])]
        x = p + "o"
    g = helper.make_graph(ns, "blocks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def encoder(path: Path, layers: int = 4, d: int = 256, ffn: int = 1024, heads: int = 4) -> None:
    """`layers` post-LN BERT encoder blocks as exporters write them below opset 17: layer norm
    as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add, GELU as x * (erf(x / sqrt 2) + 1) * 0.5;
    opset 14, x: [batch, seq, d]."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def w(name, *shape, scale=0.05):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(name, v):
        inits.append(numpy_helper.from_array(np.asarray(v), name))
        return name

    def node(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], name=out, **kw))
        return out

    def layer_norm(x, p):
        mean = node("ReduceMean", [x], p + "mean", axes=[-1])
        dev = node("Sub", [x, mean], p + "dev")
        var = node("ReduceMean", [node("Pow", [dev, "two"], p + "sq")], p + "var", axes=[-1])
        std = node("Sqrt", [node("Add", [var, "eps"], p + "var_eps")], p + "std")
        n = node("Div", [dev, std], p + "norm")
        return node("Add", [node("Mul", [n, w(p + "g", d, scale=1)], p + "scaled"), w(p + "b", d)], p + "out")

    def linear(x, p, k, n):
        return node("Add", [node("MatMul", [x, w(p + "w", k, n)], p + "mm"), w(p + "b", n)], p + "out")

    dh = d // heads
    c("two", np.array(2.0, np.float32)), c("eps", np.array(1e-12, np.float32))
    c("sqrt2", np.array(np.sqrt(2), np.float32)), c("one", np.array(1.0, np.float32))
    c("half", np.array(0.5, np.float32)), c("inv_sqrt_dh", np.array(1 / np.sqrt(dh), np.float32))
    c("shape_heads", np.array([0, -1, heads, dh], np.int64)), c("shape_model", np.array([0, -1, d], np.int64))
    x = "x"
    for i in range(layers):
        p = f"l{i}_"
        qkv = []
        for t in "qkv":
            r = node("Reshape", [linear(x, p + t + "_", d, d), "shape_heads"], p + t + "_r")
            qkv.append(node("Transpose", [r], p + t + "_t", perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]))
        s = node("Mul", [node("MatMul", qkv[:2], p + "scores"), "inv_sqrt_dh"], p + "scaled")
        ctx = node("MatMul", [node("Softmax", [s], p + "attn", axis=-1), qkv[2]], p + "ctx")
        ctx = node("Reshape", [node("Transpose", [ctx], p + "ctx_t", perm=[0, 2, 1, 3]), "shape_model"], p + "ctx_r")
        x = layer_norm(node("Add", [x, linear(ctx, p + "o_", d, d)], p + "res1"), p + "ln1_")
        h = linear(x, p + "ff1_", d, ffn)
        erf = node("Add", [node("Erf", [node("Div", [h, "sqrt2"], p + "gelu_s")], p + "gelu_erf"), "one"], p + "gelu_1")
        g = node("Mul", [node("Mul", [h, erf], p + "gelu_x"), "half"], p + "gelu")
        x = layer_norm(node("Add", [x, linear(g, p + "ff2_", ffn, d)], p + "res2"), p + "ln2_")
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", "seq", d])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 7
    onnx.save(m, path)


def count(path: Path) -> int:
    if path.suffix == ".mcpir":
        from mcp_compiler.mcpir import read_mcpir

        return sum(1 for _ in read_mcpir(path).graph.walk())
    m = onnx.load(path, load_external_data=False)

    def walk(g):
        return sum(1 + sum(walk(a.g) for a in n.attribute if a.HasField("g")) for n in g.node)
    return walk(m.graph)


def feeds_for(name: str, path: Path) -> dict:
    """The PP-OCR models at the sizes rapidocr uses; any other model at inputs it accepts, batch 1
    (mcp_compiler.inputs, as verify and deploy make them)."""
    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.inputs import make, plan

    rng = np.random.default_rng(0)
    if name in ZOO_INPUTS:
        m = onnx.load(path, load_external_data=False)
        inits = {t.name for t in m.graph.initializer}
        return {vi.name: rng.random(ZOO_INPUTS[name], dtype=np.float32) for vi in m.graph.input
                if vi.name not in inits}
    model = load_onnx(path, check=False, infer_shapes=False).model
    return make(model, plan(model), rng, batch=1)


def latencies(paths: dict[str, Path], feeds: dict, reps: int) -> dict[str, str]:
    """Median ms of `reps` runs of each model, the models taking turns run by run (so that the
    machine's noise falls on all of them alike); a model onnxruntime rejects says so."""
    sessions, out = {}, {}
    for k, p in paths.items():
        try:
            # One intra-op thread: with the default pool, each idle session's threads spin and
            # steal the two cores from the session whose turn it is (seen here: the same model
            # 10 ms or 18 ms).
            sess = ort_session(p, threads=1)
            sess.run(None, feeds)
            sessions[k] = sess
        except Exception as e:  # noqa: BLE001 - a peer's output onnxruntime rejects
            out[k] = f"fails ({str(e).splitlines()[0][:40]})"
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(reps):
        for k, sess in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, feeds)
            times[k].append(time.perf_counter() - t0)
    out.update({k: f"{statistics.median(ts) * 1e3:.2f}" for k, ts in times.items()})
    return out


# The opt-in flags of the second mcp-cli column, by model: newer opsets let the fusions use
# HardSwish (14), LayerNormalization (17), Gelu (20); a larger fold limit materializes weights.
ZOO_FLAGS = ["--opset", "20"]
LIGHT_FLAGS = ["--fold-size-limit", "4096"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="two small models, one run; nothing written")
    args = ap.parse_args()
    runs, reps = (1, 3) if args.quick else (args.runs, args.reps)
    rows, scale = [], {}
    with tempfile.TemporaryDirectory(prefix="mcp-bench-passes-") as d:
        d = Path(d)
        models = [(p.stem, p, ZOO_FLAGS) for p in [p for _, p in zoo_models("ppocr")]]
        models += [(p.stem, p, LIGHT_FLAGS) for p in sorted(LIGHT.glob("*.onnx"))]
        encoder(d / "encoder.onnx")
        models.append(("encoder", d / "encoder.onnx", ["--opset", "20"]))
        sizes = (700, 7000) if args.quick else (5000, 50000)
        for n in sizes:
            p = d / f"blocks{n // 1000}k.onnx"
            conv_blocks(p, n)
            models.append((p.stem, p, []))
        if args.quick:
            models = models[:1] + models[-3:]
        for name, src, flags in models:
            outs = {"mcp-cli": d / "repo" / "m" / "1" / "model.mcpir",
                    "mcp-cli +flags": d / "repo" / "f" / "1" / "model.mcpir", "onnxslim": d / "slim.onnx",
                    "onnxsim": d / "sim.onnx", "ORT basic": d / "ort_basic.onnx"}
            mine = [PY, "-m", "mcp_compiler.cli", "convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(d / "repo"),
                    "--force"]
            cmds = {"mcp-cli": [*mine, "--name", "m"], "mcp-cli +flags": [*mine, "--name", "f", *flags],
                    "onnxslim": [str(Path(PY).parent / "onnxslim"), str(src), str(outs["onnxslim"])],
                    "onnxsim": [PY, "-c", ONNXSIM, str(src), str(outs["onnxsim"])],
                    "ORT basic": [PY, "-c", ORT_BASIC, str(src), str(outs["ORT basic"])]}
            if not flags:
                del cmds["mcp-cli +flags"]   # the same command as the default column
            res: dict[str, list] = {k: [] for k in cmds}
            for _ in range(runs):
                for k, cmd in cmds.items():
                    if res[k] and res[k][-1].rc != 0:
                        continue   # failed or timed out once: not retried
                    res[k].append(measure(cmd, timeout=TIMEOUT))
            ok = {k: bool(rs) and all(r.rc == 0 for r in rs) and outs[k].exists() for k, rs in res.items()}
            timed = {"original": src, **{k: outs[k] for k in ("mcp-cli", "mcp-cli +flags", "onnxslim")
                                         if ok.get(k)}}
            lat = latencies(timed, feeds_for(name, src), reps)
            lat0 = lat["original"]
            cells = {}
            for k, rs in res.items():
                if not ok[k]:
                    why = "timeout" if rs and rs[-1].rc == -9 else "failed"
                    cells[k] = (why, "", "", "")
                    continue
                wall = statistics.median(r.wall for r in rs)
                rss = statistics.median(r.rss_mb for r in rs)
                cells[k] = (count(outs[k]), f"{wall:.2f}", f"{rss:.0f}", lat.get(k, ""))
                if k == "mcp-cli" and name.startswith("blocks"):
                    scale[name] = wall
            cells.setdefault("mcp-cli +flags", cells["mcp-cli"])
            row = [name, count(src), " ".join(flags) or "-"]
            row += [cells[k][0] for k in ("mcp-cli", "mcp-cli +flags", "onnxslim", "onnxsim", "ORT basic")]
            row += [cells[k][1] for k in ("mcp-cli", "mcp-cli +flags", "onnxslim", "onnxsim")]
            row += [cells[k][2] for k in ("mcp-cli", "mcp-cli +flags", "onnxslim", "onnxsim")]
            row += [lat0, cells["mcp-cli"][3], cells["mcp-cli +flags"][3], cells["onnxslim"][3]]
            rows.append(row)
            print(" | ".join(map(str, row)), flush=True)
            shutil.rmtree(d / "repo", ignore_errors=True)
    import onnxsim
    import onnxslim

    keys = sorted(scale, key=lambda k: int(k[len("blocks"):-1]))   # by size: 5k before 50k
    growth = scale[keys[1]] / scale[keys[0]] if len(keys) == 2 else float("nan")

    def at_or_below(col: int) -> int:   # where onnxslim timed out or failed, ours counts as at or below
        return sum(1 for r in rows if isinstance(r[col], int) and (not isinstance(r[5], int) or r[col] <= r[5]))

    def ratio(a: str, b: str) -> str:
        try:
            return f"{float(a) / float(b):.2f}"
        except ValueError:
            return "-"

    speed = [ratio(r[8], r[10]) for r in rows]
    body = "\n\n".join([
        "## Pass pipeline vs onnxslim, onnxsim and onnxruntime's basic optimization",
        f"Written by `python benchmarks/bench_passes.py --runs {runs}`. Machine: {machine()}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in versions().items())
        + f", onnxslim {onnxslim.__version__}, onnxsim {onnxsim.__version__}.",
        "Node counts after each tool; conversion wall seconds and peak RSS MB (whole process, "
        f"median of {runs}, tools interleaved; ours includes writing the Triton repository); "
        f"onnxruntime CPU latency ms (batch 1, default optimizations, one intra-op thread, median of {reps} runs, the "
        "models taking turns run by run) of the original, of our .mcpir (through "
        "mcp_compiler.session) and of onnxslim's output. "
        "`mcp-cli` is the default pipeline; `+flags` adds the opt-in flags of the `flags` column: "
        "`--opset N` raises the model's opset first so that the fusions may use HardSwish (14), "
        "LayerNormalization (17) and Gelu (20); `--fold-size-limit 4096` (MB) lets constant folding "
        "materialize weights that ops generate (onnx's light models make theirs with "
        "ConstantOfShape), as onnxslim and onnxsim do; by default folding never grows a tensor past "
        "1 MB. `encoder`: a generated 4-layer BERT-style encoder (d 256, opset 14) with layer norm "
        "and GELU written out as exporters write them below opset 17. `blocks*`: generated "
        "Conv -> BatchNormalization -> hard-swish -> Identity chains.",
        table(["model", "nodes", "flags", "mcp-cli", "+flags", "onnxslim", "onnxsim", "ORT basic", "mcp s",
               "+flags s", "slim s", "sim s", "mcp MB", "+flags MB", "slim MB", "sim MB", "lat orig", "lat mcp",
               "lat +flags", "lat slim"], rows),
        f"Node count at or below onnxslim's on {at_or_below(3)} of {len(rows)} models by default and on "
        f"{at_or_below(4)} of {len(rows)} with the flags. Conversion time, mcp-cli / onnxslim: "
        + ", ".join(f"{r[0]} {x}" for r, x in zip(rows, speed))
        + f". Growth: {keys[1] if keys else '-'} takes {growth:.1f}x the time of {keys[0] if keys else '-'} "
        "(goal <= 12x).",
    ])
    print(body)
    if not args.quick:
        write_section("passes", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
