"""Inputs a model accepts: the old rules against mcp_compiler.inputs on every real model of the zoo.

For each model of golden_models/zoo.yaml, run the original in onnxruntime on
- the old verify rule (dims by axis position: 2 at axis 0, 32 elsewhere; integers in [0, 3)),
- the old smoke rule of deploy (every symbol 1, batch 1; integers 0),
- mcp_compiler.inputs (sizes per symbol from the ops' requirements, probed; value domains),
and report whether it runs with finite outputs, which outputs the sample exercises, the sizes
found, the probes needed and the planning time. No --dims anywhere.

    python benchmarks/bench_inputs.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _measure import machine, versions, zoo_models
from _results import table, write_section


def _old_feeds(model, smoke: bool) -> dict:
    from mcp_compiler.ir import DataType

    rng = np.random.default_rng(0)
    feeds = {}
    for v in model.graph.inputs:
        if v.const is not None:
            continue
        shape = [d if isinstance(d, int) else (1 if smoke else 2 if axis == 0 else 32)
                 for axis, d in enumerate(v.type.shape)]
        dt = DataType(v.type.elem_type).numpy_dtype
        if np.issubdtype(dt, np.floating):
            feeds[v.name] = rng.standard_normal(shape).astype(dt)
        else:
            feeds[v.name] = (np.zeros(shape) if smoke else rng.integers(0, 3, shape)).astype(dt)
    return feeds


def _outcome(sess, feeds: dict) -> tuple[str, str]:
    from mcp_compiler.inputs import exercised

    try:
        outs = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001
        return "fails", str(e).strip().splitlines()[0][:90]
    if any(np.asarray(o).dtype.kind in "fc" and not np.isfinite(np.asarray(o)).all() for o in outs):
        return "non-finite", ""
    return "runs", f"{sum(map(exercised, outs))}/{len(outs)} exercised"


def main() -> None:
    import onnxruntime as ort

    from mcp_compiler.errors import McpError
    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.inputs import make, plan, probe
    from mcp_compiler.session import quiet_options

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first 4 models; nothing written")
    args = ap.parse_args()
    models = zoo_models()[:4] if args.quick else zoo_models()
    rows, counts = [], {"old verify": 0, "old smoke": 0, "new": 0}
    for name, path in models:
        sess = ort.InferenceSession(str(path), quiet_options(prepack=False), providers=["CPUExecutionProvider"])
        model = load_onnx(path, check=False, infer_shapes=False).model
        old_v = _outcome(sess, _old_feeds(model, smoke=False))
        old_s = _outcome(sess, _old_feeds(model, smoke=True))
        t0 = time.perf_counter()
        try:
            p = plan(load_onnx(path, check=False, infer_shapes=False).model)
            probe(model, p, lambda f, s=sess: s.run(None, f))
            new = _outcome(sess, make(model, p, np.random.default_rng(0)))
            sizes = ", ".join(f"{k}={v}" for k, v in p.sizes.items()) or "static"
            probes = len(p.tried)
        except McpError as e:
            new, sizes, probes = ("fails", str(e)[:90]), "-", "-"
        dt = time.perf_counter() - t0
        for key, o in (("old verify", old_v), ("old smoke", old_s), ("new", new)):
            counts[key] += o[0] == "runs"
        rows.append([name, f"{old_v[0]} {old_v[1]}".strip(), f"{old_s[0]} {old_s[1]}".strip(),
                     f"{new[0]} {new[1]}".strip(), sizes, probes, f"{dt:.2f}"])
        print(rows[-1], flush=True)
    n = len(models)
    summary = (f"The original runs with finite outputs on: old verify rule {counts['old verify']}/{n}, "
               f"old smoke rule {counts['old smoke']}/{n}, mcp_compiler.inputs {counts['new']}/{n}.")
    print(summary)
    if args.quick:
        return
    body = "\n\n".join([
        "## Inputs a model accepts (`python benchmarks/bench_inputs.py`)",
        f"{machine()}; " + ", ".join(f"{k} {v}" for k, v in versions().items()) + ". Every real model of golden_models/zoo.yaml, no `--dims`. "
        "Old verify rule: dims by axis position (2 at axis 0, 32 elsewhere), integers in [0, 3). "
        "Old smoke rule (deploy): every symbol 1, integers 0. New: mcp_compiler.inputs (plan from "
        "the ops' requirements, then probe). \"exercised\": outputs not all within 1e-4 of zero "
        "and not constant. Planning s: plan + probe, whole.",
        summary,
        table(["model", "old verify rule", "old smoke rule", "mcp_compiler.inputs", "sizes found",
               "probes", "planning s"], rows)])
    write_section("inputs", body)


if __name__ == "__main__":
    main()
