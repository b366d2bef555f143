"""`mcp-cli bench` on an LLM generation entry: streams at given concurrencies (closed loop, each
client sending its next request when its last stream ends), prompt and output lengths, and a
shared-prefix (dialogue) load; per point time to first token and between tokens (p50/p99),
tokens/s per stream and in all, the prefix hit rate, errors, and the pool's peak blocks (from the
server's metrics, sampled while the point runs)."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import asdict, dataclass

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


@dataclass
class LLMPoint:
    concurrency: int
    requests: int
    errors: int
    prompt_tokens: float          # mean a request
    output_tokens: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tbt_p50_ms: float
    tbt_p99_ms: float
    stream_tps: float             # median of the streams' decode tokens/s
    aggregate_tps: float
    prefix_hit_rate: float
    peak_blocks: float | None
    blocks_total: float | None
    seconds: float
    first_error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] * 1000 if xs else float("nan")


def prompt_text(i: int, words: int, shared: int) -> str:
    """`shared` words every request has, then `words` of its own."""
    common = " ".join(WORDS[k % len(WORDS)] for k in range(shared))
    own = " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] + str(i % 97) for k in range(words))
    return (common + " " + own).strip()


class _Sampler:
    """Samples a metrics endpoint's mcp_kv_cache_blocks_used for the entry while a point runs."""

    def __init__(self, url: str | None, model: str) -> None:
        self.url, self.model = url, model
        self.peak = self.total = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if url else None

    def _read(self) -> tuple[float | None, float | None]:
        from .metrics import scrape

        try:
            got = scrape(self.url, timeout=5)
        except Exception:  # noqa: BLE001 - the figure is left out, the point stands
            return None, None
        used = total = None
        for name, labels, value in got:
            if labels.get("model") != self.model:
                continue
            if name == "mcp_kv_cache_blocks_used":
                used = value
            elif name == "mcp_kv_cache_blocks_total":
                total = value
        return used, total

    def _run(self) -> None:
        while not self._stop.is_set():
            used, total = self._read()
            if used is not None:
                self.peak = used if self.peak is None else max(self.peak, used)
                self.total = total
            self._stop.wait(0.1)

    def __enter__(self) -> _Sampler:
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *a) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)


async def _point(conn, model: str, concurrency: int, per_client: int, words: int, output: int,  # noqa: ANN001
                 shared: int) -> LLMPoint:
    from .client import aio_client
    from .llm_client import GenerationError, stream

    records, errors = [], []
    client = aio_client(conn)

    async def one_client(c: int) -> None:
        for r in range(per_client):
            i = c * per_client + r
            t0 = time.perf_counter()
            times, usage = [], None
            try:
                async for chunk in stream(client, model, prompt=prompt_text(i, words, shared), headers=conn.headers(),
                                          sampling={"max_tokens": output, "ignore_eos": True}):
                    if chunk.ids:
                        times.append(time.perf_counter())
                    usage = chunk.usage or usage
            except GenerationError as e:
                errors.append(str(e))
                continue
            records.append((t0, times, usage or {}))

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*[one_client(c) for c in range(concurrency)])
    finally:
        await client.close()
    wall = time.perf_counter() - t0
    ttft = [t[0] - s for s, t, _ in records if t]
    tbt = [b - a for _, t, _ in records for a, b in zip(t, t[1:])]
    streams = [(len(t) - 1) / (t[-1] - t[0]) for _, t, _ in records if len(t) > 1 and t[-1] > t[0]]
    prompt = [u.get("prompt_tokens", 0) for _, _, u in records]
    cached = [u.get("cached_tokens", 0) for _, _, u in records]
    tokens = sum(len(t) for _, t, _ in records)
    return LLMPoint(concurrency, len(records) + len(errors), len(errors),
                    statistics.mean(prompt) if prompt else 0.0, tokens / len(records) if records else 0.0,
                    _pct(ttft, 0.5), _pct(ttft, 0.99), _pct(tbt, 0.5), _pct(tbt, 0.99),
                    statistics.median(streams) if streams else 0.0, tokens / wall,
                    sum(cached) / sum(prompt) if sum(prompt) else 0.0, None, None, round(wall, 3),
                    errors[0] if errors else None)


def measure_llm(conn, model: str, concurrencies: list[int], *, prompt_words: int = 96, output_tokens: int = 64,  # noqa: ANN001
                shared_prefix: int = 0, per_client: int = 2, metrics_url: str | None = None,
                progress=None) -> list[LLMPoint]:  # noqa: ANN001
    from .llm_client import run

    points = []
    run(_point(conn, model, 1, 1, 8, 2, 0))   # warm: the first request's allocations are not measured
    for n in concurrencies:
        if progress:
            progress(f"{n} stream(s) x {per_client} request(s) each")
        with _Sampler(metrics_url, model) as sampler:
            p = run(_point(conn, model, n, per_client, prompt_words, output_tokens, shared_prefix))
        p.peak_blocks, p.blocks_total = sampler.peak, sampler.total
        points.append(p)
    return points


def table_rows(points: list[LLMPoint]) -> list[list[str]]:
    def f(v: float | None, fmt: str = "{:.1f}") -> str:
        return "-" if v is None or v != v else fmt.format(v)

    return [[str(p.concurrency), str(p.requests), str(p.errors), f(p.prompt_tokens, "{:.0f}"), f(p.ttft_p50_ms),
             f(p.ttft_p99_ms), f(p.tbt_p50_ms), f(p.tbt_p99_ms), f(p.stream_tps), f(p.aggregate_tps),
             f(p.prefix_hit_rate * 100, "{:.0f}%"),
             "-" if p.peak_blocks is None else f"{p.peak_blocks:.0f}/{p.blocks_total:.0f}"] for p in points]


# (times in ms; tok/s of one stream and of all; the prefix cache's share of the prompt tokens)
HEADERS = ["N", "req", "err", "prompt", "ttft50", "ttft99", "tbt50", "tbt99", "tok/s 1", "tok/s", "hits", "blocks"]
