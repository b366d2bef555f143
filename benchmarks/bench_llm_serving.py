"""An LLM entry served by the real local Triton against llama-cpp-python's OpenAI server, side by
side on the same GGUF and threads: single-stream decode tokens/s (and against the entry's own
in-process decode), 8 concurrent streams (aggregate tokens/s, p50/p99 time between tokens), time
to first token of a request whose ~600-token prefix is cached against one whose prefix is new,
the server's memory against weights + pool, and 64 streams dropped mid-generation.

    python benchmarks/bench_llm_serving.py --peer-python /path/to/bench-venv/bin/python [--runs 3]

The peer runs in its own venv (`pip install 'llama-cpp-python[server]==0.3.36'`); never the
project's dependencies. Ours is measured twice: over gRPC's stream (what Triton clients use) and
through `serve --openai-port`'s front (what llama.cpp's server is: OpenAI's API over HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import table, write_section
from bench_llm import CHAT, zoo_gguf

from mcp_compiler.targets.triton.llm_client import run as run_shared  # grpc asyncio: one loop a process

FILLER = ("The history of computing is a story of abstraction: each layer hides the one below it, and every "
          "generation of engineers builds on the work of the last. ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


# -- one client stream: (ttft, [arrival times of each token event]) -------------------------------
async def grpc_stream(url: str, model: str, prompt: str, max_tokens: int):
    import tritonclient.grpc.aio as aio

    from mcp_compiler.targets.triton.llm_client import stream

    c = aio.InferenceServerClient(url)
    t0 = time.perf_counter()
    times = []
    try:
        async for chunk in stream(c, model, prompt=prompt, sampling={"max_tokens": max_tokens, "ignore_eos": True}):
            if chunk.ids:
                times.append(time.perf_counter())
    finally:
        await c.close()
    return t0, times


async def sse_stream(client, base: str, model: str, prompt: str, max_tokens: int):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    t0 = time.perf_counter()
    times = []
    async with client.stream("POST", f"{base}/v1/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise SystemExit(f"{base}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and (ev["choices"][0].get("text") or ev["choices"][0].get("finish_reason") is None):
                times.append(time.perf_counter())
    return t0, times


def summarize(results: list, wall: float) -> dict:
    tokens = sum(len(t) for _, t in results)
    tbt = [b - a for _, t in results for a, b in zip(t, t[1:])]
    per_stream = [(len(t) - 1) / (t[-1] - t[0]) for _, t in results if len(t) > 1]
    return {"aggregate_tps": tokens / wall, "stream_tps": statistics.median(per_stream) if per_stream else 0.0,
            "ttft": statistics.median(t[0] - t0 for t0, t in results if t),
            "tbt_p50_ms": pct(tbt, 0.5) * 1000, "tbt_p99_ms": pct(tbt, 0.99) * 1000}


async def load(kind: str, target: str, model: str, prompts: list[str], max_tokens: int) -> dict:
    t0 = time.perf_counter()
    if kind == "grpc":
        results = await asyncio.gather(*[grpc_stream(target, model, p, max_tokens) for p in prompts])
    else:
        import httpx

        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
            results = await asyncio.gather(*[sse_stream(client, target, model, p, max_tokens) for p in prompts])
    return summarize(results, time.perf_counter() - t0)


async def ttft(kind: str, target: str, model: str, prompt: str) -> float:
    got = await load(kind, target, model, [prompt], 1)
    return got["ttft"]


# -- servers --------------------------------------------------------------------------------------
class Ours:
    def __init__(self, repo: Path) -> None:
        self.repo = repo

    def __enter__(self) -> Ours:
        from mcp_compiler.targets.triton.openai_front import Front, FrontServer
        from mcp_compiler.targets.triton.serve import TritonServer

        self.server = TritonServer(self.repo, mode="explicit", load_all=True).__enter__()
        self.front = FrontServer(Front(self.server.grpc_url))
        self.base = f"http://127.0.0.1:{self.front.start()}"
        return self

    def __exit__(self, *a) -> None:
        self.front.stop()
        self.server.__exit__(*a)

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://{self.server.metrics_url}/metrics", timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))

    def rss_bytes(self) -> int:
        """The server and its python-backend stubs (the model runs in a stub process)."""
        pids = [self.server.proc.pid]
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.server.proc.pid)], capture_output=True, text=True)
        pids += [int(p) for p in out.stdout.split()]
        total = 0
        for pid in pids:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                pass
        return total


class LlamaCpp:
    def __init__(self, python: str, gguf: Path, threads: int) -> None:
        self.python, self.gguf, self.threads = python, gguf, threads

    def __enter__(self) -> LlamaCpp:
        port = free_port()
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([self.python, "-m", "llama_cpp.server", "--model", str(self.gguf), "--host",
                                      "127.0.0.1", "--port", str(port), "--n_threads", str(self.threads),
                                      "--n_threads_batch", str(self.threads), "--n_ctx", "4096",
                                      "--model_alias", "smol", "--interrupt_requests", "False"],   # serve each, not cut the last short
                                     stdout=subprocess.DEVNULL, stderr=self.log, text=True)   # it logs a lot: a file
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.base}/v1/models", timeout=2)
                return self
            except OSError:
                if self.proc.poll() is not None:
                    self.log.seek(0)
                    raise SystemExit(f"llama_cpp.server exited: {self.log.read()[-500:]}") from None
                time.sleep(0.5)
        raise SystemExit("llama_cpp.server did not start")

    def __exit__(self, *a) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()

    def version(self) -> str:
        r = subprocess.run([self.python, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True,
                           text=True)
        return f"llama-cpp-python {r.stdout.strip()} (its OpenAI server)"


def in_process_decode(repo: Path, prompt_ids: list[int], n: int, threads: int) -> float:
    """The entry's engine in this process (what the server runs, without Triton)."""
    from bench_llm import engine_speed

    return engine_speed(repo, threads, prompt_ids, n)[1]


async def drop_streams(url: str, model: str, n: int) -> None:
    """n streams at once, each closed after its first token (those still queued: cancelled too)."""
    import tritonclient.grpc.aio as aio

    from mcp_compiler.targets.triton.llm_client import stream

    c = aio.InferenceServerClient(url)

    async def one(i: int) -> None:
        g = stream(c, model, prompt=f"Story number {i}:", sampling={"max_tokens": 200, "ignore_eos": True})
        try:
            await g.__anext__()
        finally:
            await g.aclose()

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(1.0)
    for t in tasks:   # the ones still waiting for a slot: their clients leave too
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await c.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-python", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kv-cache-bytes", default="512MiB")
    a = ap.parse_args()
    gguf = zoo_gguf()
    from mcp_compiler.llm.gguf_file import read_gguf
    from mcp_compiler.llm.tokenizer import ChatTokenizer, from_gguf

    tok = ChatTokenizer(from_gguf(read_gguf(gguf).metadata, gguf))
    prompt = " ".join(CHAT) * 3                                    # ~160 tokens
    prompt_ids = tok.encode(prompt)
    prefix = FILLER * 20                                           # ~600 tokens
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-m", "mcp_compiler.cli", "convert", str(gguf), "-t", "triton-v1.12", "-o", d,
                            "--name", "smol", "--kv-cache-bytes", a.kv_cache_bytes], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"convert failed: {r.stderr}")
        repo = Path(d)
        weights = (repo / "smol" / "1" / "model.mcpir").stat().st_size
        from mcp_compiler.targets.triton.flags import parse_bytes

        pool = parse_bytes(a.kv_cache_bytes, "--kv-cache-bytes")
        rows: dict[str, list] = {}

        def add(key: str, value: float) -> None:
            rows.setdefault(key, []).append(value)

        peer_version = ""
        for run in range(a.runs):   # paired: each run measures ours and the peer back to back
            add("in-process decode tok/s", in_process_decode(repo / "smol", prompt_ids, a.tokens, a.threads))
            with Ours(repo) as ours:
                # first-run allocations, and the 8-stream shapes, before anything is measured
                run_shared(load("grpc", ours.server.grpc_url, "smol", [f"{i}. {prompt}" for i in range(8)], 4))
                for kind, target in (("grpc", ours.server.grpc_url), ("openai", ours.base)):
                    one = run_shared(load(kind, target, "smol", [prompt], a.tokens))
                    add(f"ours {kind} 1 stream tok/s", one["stream_tps"])
                    eight = run_shared(load(kind, target, "smol", [f"{i}. {prompt}" for i in range(8)], a.tokens))
                    add(f"ours {kind} 8 streams aggregate tok/s", eight["aggregate_tps"])
                    add(f"ours {kind} 8 streams tbt p50 ms", eight["tbt_p50_ms"])
                    add(f"ours {kind} 8 streams tbt p99 ms", eight["tbt_p99_ms"])
                uniq = f"Run {run}. " + prefix
                add("ours ttft new prefix s", run_shared(ttft("openai", ours.base, "smol", uniq + "Question one?")))
                add("ours ttft cached prefix s", run_shared(ttft("openai", ours.base, "smol", uniq + "Question two?")))
                add("ours server RSS MB", ours.rss_bytes() / 1e6)
                run_shared(drop_streams(ours.server.grpc_url, "smol", 64))
                deadline = time.monotonic() + 60
                while ours.metric("mcp_kv_cache_blocks_used") and time.monotonic() < deadline:
                    time.sleep(0.2)
                add("ours blocks used after 64 dropped streams", ours.metric("mcp_kv_cache_blocks_used"))
            with LlamaCpp(a.peer_python, gguf, a.threads) as peer:
                peer_version = peer.version()
                run_shared(load("openai", peer.base, "smol", ["warm up"], 4))
                one = run_shared(load("openai", peer.base, "smol", [prompt], a.tokens))
                add("llama.cpp 1 stream tok/s", one["stream_tps"])
                eight = run_shared(load("openai", peer.base, "smol", [f"{i}. {prompt}" for i in range(8)], a.tokens))
                add("llama.cpp 8 streams aggregate tok/s", eight["aggregate_tps"])
                add("llama.cpp 8 streams tbt p99 ms", eight["tbt_p99_ms"])
                uniq = f"Run {run}. " + prefix
                add("llama.cpp ttft new prefix s", run_shared(ttft("openai", peer.base, "smol", uniq + "Question one?")))
                add("llama.cpp ttft cached prefix s", run_shared(ttft("openai", peer.base, "smol", uniq + "Question two?")))
    med = {k: statistics.median(v) for k, v in rows.items()}
    spread = {k: (min(v), max(v)) for k, v in rows.items()}
    ratio = lambda a_, b_: [x / y for x, y in zip(rows[a_], rows[b_])]  # noqa: E731

    def r(a_: str, b_: str) -> str:
        xs = ratio(a_, b_)
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    goals = [
        ["served 1 stream (gRPC) / the engine in-process", r("ours grpc 1 stream tok/s", "in-process decode tok/s"), ">= 0.9"],
        ["served 1 stream (OpenAI front) / in-process", r("ours openai 1 stream tok/s", "in-process decode tok/s"), ">= 0.9"],
        ["served 1 stream (OpenAI front) / llama.cpp server", r("ours openai 1 stream tok/s", "llama.cpp 1 stream tok/s"), ">= 1"],
        ["8 streams aggregate / 1 stream (ours, gRPC)", r("ours grpc 8 streams aggregate tok/s", "ours grpc 1 stream tok/s"), ">= 3"],
        ["8 streams aggregate: ours (OpenAI) / llama.cpp", r("ours openai 8 streams aggregate tok/s",
                                                             "llama.cpp 8 streams aggregate tok/s"), ">= 2"],
        ["ttft cached / new ~600-token prefix (ours)", r("ours ttft cached prefix s", "ours ttft new prefix s"), "<= 0.25"],
        ["ttft cached / new prefix (llama.cpp)", r("llama.cpp ttft cached prefix s", "llama.cpp ttft new prefix s"), "-"],
    ]
    figures = [[k, f"{med[k]:.3g}", f"{spread[k][0]:.3g}-{spread[k][1]:.3g}"] for k in rows]
    body = (f"## LLM served: SmolLM2-135M-Instruct Q4_1 on the local Triton vs llama.cpp's server\n\n"
            f"Written by `python benchmarks/bench_llm_serving.py --peer-python PEER --runs {a.runs}`. Machine: "
            f"{platform.machine()}, {a.threads} threads, {platform.processor() or platform.platform()}. Peer: "
            f"{peer_version}. {a.tokens} tokens a stream (ignore_eos), a {len(prompt_ids)}-token prompt; "
            f"prefix ~{len(tok.encode(prefix))} tokens; the entry's pool {a.kv_cache_bytes}; weights {weights:,} bytes. "
            f"Paired runs (ours then the peer, {a.runs} times): medians and the min-max of the paired ratios.\n\n"
            + table(["goal", "measured", "target"], goals)
            + "\n\nFigures (median, min-max over runs):\n\n" + table(["figure", "median", "range"], figures)
            + f"\n\nMemory: server RSS {med['ours server RSS MB']:.0f} MB against weights {weights / 1e6:.0f} MB + "
              f"pool {pool / 1e6:.0f} MB + 400 MB = {(weights + pool) / 1e6 + 400:.0f} MB.")
    write_section("llm_serving", body)
    print(body)


if __name__ == "__main__":
    main()
