"""Conversion speed side by side with onnxslim and onnxruntime's offline optimization: the zoo, and generated graphs of 10k, 50k and
100k nodes (goals: <= 1.0x ORT basic from 10k nodes up, 100k <= 10x the 10k one; <= 2.0x ORT basic on the small real models;
`mcp-cli --version` <= 0.85x `import onnxruntime`).

    python benchmarks/bench_scale.py [--runs 5] [--quick]

`floor`: a process doing only what every conversion does by design besides its own work on the
nodes: import numpy, onnx and onnxruntime, parse the file, the ONNX checker and shape inference,
and the load check's onnxruntime session on the converted result (no passes, no IR, nothing
written). Where the floor alone reaches ORT basic's time, no Python pipeline can get under it.

`mcp-cli convert --target triton-v1.12` (frontend, checker, shape inference, the normalization
pipeline, .mcpir and repository) vs `onnxslim in.onnx out.onnx` (its default optimization), each
a whole process; node counts after each.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, measure, versions, zoo_models
from _results import table, write_section
from bench_convert import ort_offline_cmd

HERE = Path(__file__).resolve().parent
PY = sys.executable
PEER_TIMEOUT = 90.0  # seconds; a peer slower than this is reported as a timeout, not waited for
# The command users run: the console script beside the interpreter (`python -m mcp_compiler.cli`
# where it is not installed: some 15 ms slower a run here, numpy's typing modules load slower under runpy).
_SCRIPT = Path(PY).parent / "mcp-cli"
MCP = [str(_SCRIPT)] if _SCRIPT.exists() else [PY, "-m", "mcp_compiler.cli"]


# the fixed part of a conversion (see the module doc): argv = original model, converted model
FLOOR = """
import sys
import onnx, onnx.checker, onnx.shape_inference, onnxruntime as ort
from mcp_compiler.session import load_check_options
m = onnx.load(sys.argv[1])
onnx.checker.check_model(m)
onnx.shape_inference.infer_shapes(m)
# the python backend's check: loading resolved, nothing optimized
ort.InferenceSession(sys.argv[2], load_check_options(optimize=False), providers=["CPUExecutionProvider"])
"""


def deep_graph(path: Path, nodes: int) -> None:
    """Chains of Constant -> Mul -> Relu -> Identity (foldable, removable): `nodes` nodes."""
    ns, prev = [], "x"
    for i in range(nodes // 4):
        ns += [helper.make_node("Constant", [], [f"c{i}"], value=numpy_helper.from_array(np.array([1.0001], np.float32))),
               helper.make_node("Mul", [prev, f"c{i}"], [f"m{i}"]),
               helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
               helper.make_node("Identity", [f"r{i}"], [f"i{i}"])]
        prev = f"i{i}"
    g = helper.make_graph(ns, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", 8])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def count(path: Path) -> int:
    m = onnx.load(path, load_external_data=False)

    def walk(g):
        return sum(1 + sum(walk(a.g) for a in n.attribute if a.HasField("g")) for n in g.node)
    return walk(m.graph)


def mcp_nodes(repo: Path) -> int:
    from mcp_compiler.mcpir import read_mcpir

    entry = next(p for p in repo.iterdir() if p.is_dir())
    return sum(1 for _ in read_mcpir(entry / "1" / "model.mcpir").graph.walk())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.runs = 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="mcp-bench-scale-") as d:
        d = Path(d)
        small = ("ppocrv4_det", "ppocrv4_rec", "ppocr_cls", "nudenet_320n", "minilm_int8_weights")
        models = [(name, p) for name, p in zoo_models() if name in small]
        for n in ((1000, 10000) if args.quick else (10000, 50000, 100000)):
            p = d / f"deep{n // 1000}k.onnx"
            deep_graph(p, n)
            models.append((p.stem, p))
        has_slim = shutil.which("onnxslim", path=str(Path(PY).parent)) is not None
        times: dict[str, dict[str, list[float]]] = {}
        startup = {"version": [], "ort": []}
        for _ in range(max(args.runs, 5)):   # the import floor, in turns
            startup["version"].append(measure([*MCP, "--version"]).wall)
            startup["ort"].append(measure([PY, "-c", "import onnxruntime"]).wall)
        for name, src in models:
            times[name] = {"mcp": [], "slim": [], "ort": [], "floor": []}
            converted = d / "converted.onnx"   # what the load check sees, made once
            assert measure([*MCP, "convert", "-i", str(src), "-o", str(converted), "--force"]).rc == 0, name
            for _ in range(args.runs):
                repo = d / "repo"
                shutil.rmtree(repo, ignore_errors=True)
                r = measure([*MCP, "convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(repo), "--name", "m"])
                assert r.rc == 0, name
                times[name]["mcp"].append(r.wall)
                r = measure(ort_offline_cmd(src, d / "ort.onnx", False))
                assert r.rc == 0, name
                times[name]["ort"].append(r.wall)
                r = measure([PY, "-c", FLOOR, str(src), str(converted)])
                assert r.rc == 0, name
                times[name]["floor"].append(r.wall)
                if has_slim and not any(x == float("inf") for x in times[name]["slim"]):
                    r = measure([str(Path(PY).parent / "onnxslim"), str(src), str(d / "slim.onnx")],
                                timeout=PEER_TIMEOUT)
                    times[name]["slim"].append(r.wall if r.rc in (0, -9) else float("nan"))
            mcp = statistics.median(times[name]["mcp"])
            ort_s = statistics.median(times[name]["ort"])
            paired = sorted(a / b for a, b in zip(times[name]["mcp"], times[name]["ort"]))
            floor = statistics.median(times[name]["floor"])
            slim = statistics.median(times[name]["slim"]) if has_slim else float("nan")
            timed_out = slim == float("inf")
            slim_nodes = "-" if not has_slim or timed_out else count(d / "slim.onnx")
            rows.append([name, count(src), mcp_nodes(d / "repo"), slim_nodes, f"{mcp:.2f}",
                         f">{PEER_TIMEOUT:.0f} (timeout)" if timed_out else f"{slim:.2f}",
                         f"<{mcp / PEER_TIMEOUT:.2f}" if timed_out else f"{mcp / slim:.2f}",
                         count(d / "ort.onnx"), f"{ort_s:.2f}", f"{mcp / ort_s:.2f}",
                         f"{paired[0]:.2f}-{paired[-1]:.2f}", f"{floor:.2f}", f"{floor / ort_s:.2f}"])
            print(rows[-1], flush=True)
    deep = [r for r in rows if r[0].startswith("deep")]
    ratio = float(deep[-1][4]) / float(deep[0][4])
    version = statistics.median(startup["version"]) / statistics.median(startup["ort"])
    body = "\n\n".join([
        "## Conversion speed at scale, side by side with onnxslim",
        f"Written by `python benchmarks/bench_scale.py --runs {args.runs}`. Machine: {machine()}. "
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items())
        + (f", onnxslim {__import__('onnxslim').__version__}" if has_slim else ", onnxslim not installed") + ".",
        "`mcp-cli convert --target triton-v1.12` (checker, shape inference, normalization pipeline, "
        f".mcpir and repository; run as `{' '.join(Path(c).name for c in MCP)}`) vs `onnxslim in out`; "
        "whole-process wall seconds, median of "
        f"{args.runs}; `ORT basic`: onnxruntime's own offline optimization (an InferenceSession with "
        "ORT_ENABLE_BASIC and optimized_model_filepath, its import included), taking turns with the others. "
        "`deep*`: chains of Constant -> Mul -> Relu -> Identity. Node counts after "
        "differ where one tool folds or fuses what the other does not (see the passes section). "
        "`floor`: a process doing only the fixed part of every conversion (imports of numpy, onnx and "
        "onnxruntime, parsing, the ONNX checker and shape inference, the load check's onnxruntime "
        "session on the converted result), in the same turns: no Python pipeline gets under it.",
        table(["model", "nodes in", "nodes after (mcp)", "nodes after (onnxslim)", "mcp-cli s", "onnxslim s",
               "mcp / onnxslim", "nodes after (ORT basic)", "ORT basic s", "mcp / ORT basic",
               "mcp / ORT basic, paired runs (min-max)", "floor s", "floor / ORT basic"], rows),
        f"Growth: the {deep[-1][0]} graph takes {ratio:.1f}x the {deep[0][0]} one (goal <= 10x). "
        f"Start-up: `mcp-cli --version` {statistics.median(startup['version']):.2f} s, `import onnxruntime` "
        f"{statistics.median(startup['ort']):.2f} s: {version:.2f}x (goal <= 0.85x; medians of "
        f"{len(startup['ort'])} runs in turns). Goals for convert: <= 1.0x ORT basic from 10k nodes up, "
        "<= 2.0x on the small real models.",
    ])
    if not args.quick:
        write_section("scale", body)
    print(body)


if __name__ == "__main__":
    main()
