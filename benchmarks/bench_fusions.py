"""Does onnxruntime fuse mcp-cli's lowered model as it fuses the original? (issue 59, item 1)

    python benchmarks/bench_fusions.py

For every real model of golden_models/zoo.yaml (and a generated residual block whose fusion needs
declared shapes): the original's value_info count; the fused ops (com.microsoft domain, and
their count) onnxruntime makes of the original at its default optimization, of `mcp-cli convert
-o out.onnx` as written now (inner shapes declared as the original declared them) and of the same
output without any value_info (what the lowering wrote before); and the max |difference| of each
one's outputs from the original's on one sample (mcp_compiler.inputs, batch 1, as
bench_passes.py makes them), all at default optimization, one thread.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _measure import machine, ort_session, versions, zoo_models
from _results import table, write_section
from bench_passes import feeds_for


def fused(path: Path, tmp: Path) -> collections.Counter:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp / "optimized.onnx")
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    g = onnx.load(str(tmp / "optimized.onnx"), load_external_data=False).graph
    return collections.Counter(n.op_type for n in g.node if n.domain == "com.microsoft")


def diff(ref: list, got: list) -> float:
    worst = 0.0
    for a, b in zip(ref, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "fc" and a.size:
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
        elif not np.array_equal(a, b):
            worst = float("inf")
    return worst


def text(c: collections.Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"


def main() -> None:
    from test_served_as_run import _residual

    from mcp_compiler.api import compile_model
    from mcp_compiler.options import CompileOptions

    rows, same_now, same_before, declared = [], 0, 0, 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        onnx.save(_residual(True), tmp / "residual.onnx")
        models = [("residual block (generated)", tmp / "residual.onnx")] + [
            (n, p) for n, p in zoo_models() if p.suffix == ".onnx"]   # (the GGUF LLM: bench_llm.py)
        for name, path in models:
            out, bare = tmp / f"{name.split()[0]}.out.onnx", tmp / f"{name.split()[0]}.bare.onnx"
            try:
                compile_model(path, out, CompileOptions())
            except Exception as e:  # noqa: BLE001 - a model that does not convert says so
                rows.append([name, "-", f"does not convert: {str(e).splitlines()[0][:80]}", "", "", "", ""])
                continue
            m = onnx.load(str(out), load_external_data=False)
            del m.graph.value_info[:]
            onnx.save(m, bare)
            src = onnx.load(str(path), load_external_data=False)
            n_vi = len(src.graph.value_info)
            declared += n_vi > 0
            want, now, before = fused(path, tmp), fused(out, tmp), fused(bare, tmp)
            same_now += now == want
            same_before += before == want
            if name.startswith("residual"):
                feeds = {"x": np.random.default_rng(1).standard_normal((2, 5, 64)).astype(np.float32),
                         "shape": np.array([2, 5, 64], np.int64)}
            else:
                feeds = feeds_for(name, path)
            try:
                ref = ort_session(path).run(None, feeds)
                d_now = f"{diff(ref, ort_session(out).run(None, feeds)):.3g}"
                d_before = f"{diff(ref, ort_session(bare).run(None, feeds)):.3g}"
            except Exception:  # noqa: BLE001 - the batch-1 sample does not suit this model (silero's state)
                d_now = d_before = "sample refused by the original"
            rows.append([name, n_vi, text(want), "same" if now == want else text(now),
                         "same" if before == want else text(before), d_now, d_before])
            print(rows[-1], flush=True)
    import datetime

    differ = [r[0] for r in rows if r[3] != "same"]
    body = [f"`python benchmarks/bench_fusions.py`, {datetime.date.today()}; {versions()}; {machine()}", "",
            f"Fused as the original: {same_now}/{len(rows)} now, {same_before}/{len(rows)} with the lowered "
            f"model's value_info dropped (before). Originals that declare inner shapes: {declared}. Fused "
            f"otherwise than the original now: {', '.join(differ) or 'none'}.", "",
            table(["model", "original value_info", "original's fused ops (onnxruntime default)", "ours now",
                   "ours before (no value_info)", "max abs vs original, now", "before"], rows)]
    write_section("fusions", "## Fusions kept (bench_fusions.py)\n\n" + "\n".join(body))
    print("\n".join(body))


if __name__ == "__main__":
    main()
