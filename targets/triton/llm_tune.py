"""`mcp-cli tune` on an LLM generation entry: the sequences run at once (`max_concurrent_requests`)
and the KV-cache pool, for a p99 time-between-tokens SLO within a memory budget.

On a local Triton, each candidate (1, 2, 4, ... sequences, while its streams' blocks fit the
budget) is loaded with a config override and measured under the same load (`clients` streams in
closed loop); the most aggregate tokens/s whose p99 time between tokens meets the SLO wins. It
is then re-measured against the entry's own setting in alternating pairs: applied (--apply) only
when the median paired ratio's 90% interval lies above 1 + margin, as `tune` does for any entry.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mcp_compiler.errors import InvalidModelError

from .runtime import params as P

CANDIDATES = (1, 2, 4, 8, 16, 32)


@dataclass
class LLMTrial:
    max_running: int
    kv_cache_bytes: int
    aggregate_tps: float
    tbt_p99_ms: float
    ttft_p99_ms: float
    errors: int
    meets_slo: bool

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LLMTuneReport:
    model: str
    slo_tbt_p99_ms: float
    clients: int
    memory_budget: int
    baseline: dict
    trials: list[LLMTrial] = field(default_factory=list)
    best: LLMTrial | None = None
    confirmation: dict | None = None
    confirmed: bool = False
    applied: str | None = None
    spent_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kind"] = "llm"
        return d


def _config_with(cfg: Any, name: str, max_running: int, pool: int) -> tuple[Any, str]:
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    c = mc.ModelConfig()
    c.CopyFrom(cfg)
    gen = json.loads(c.parameters[P.GENERATION].string_value)
    gen.update(max_running=max_running, kv_cache_bytes=pool)
    c.parameters[P.GENERATION].string_value = json.dumps(gen, sort_keys=True)
    c.name = name
    return c, json.dumps(json_format.MessageToDict(c, preserving_proto_field_name=True))


def tune_llm(entry: str | os.PathLike, slo_tbt_p99_ms: float, *, clients: int = 16, memory_budget: int | None = None,
             prompt_words: int = 64, output_tokens: int = 32, pairs: int = 5, margin: float = 0.05,
             budget_s: float = 600.0, progress: Callable[[str], None] | None = None) -> LLMTuneReport:
    from .bench import served
    from .lifecycle import load_model
    from .llm_bench import measure_llm
    from .tune import bootstrap_median_interval

    say = progress or (lambda m: None)
    t_start = time.monotonic()
    with served(entry, None) as s:
        cfg = s.config
        gen = P.read({k: v.string_value for k, v in cfg.parameters.items()}).generation
        base_pool = gen["kv_cache_bytes"]
        budget = memory_budget or base_pool or 512 << 20
        baseline = {"max_running": gen["max_running"], "kv_cache_bytes": base_pool}
        report = LLMTuneReport(s.name, slo_tbt_p99_ms, clients, budget, baseline)
        metrics = f"http://{s.server.metrics_url}"

        def measure(max_running: int, pool: int) -> LLMTrial:
            _, js = _config_with(cfg, s.name, max_running, pool)
            load_model(s, js)
            p = measure_llm(s.conn, s.name, [clients], prompt_words=prompt_words, output_tokens=output_tokens,
                            per_client=1, metrics_url=metrics)[0]
            return LLMTrial(max_running, pool, round(p.aggregate_tps, 2), round(p.tbt_p99_ms, 2),
                            round(p.ttft_p99_ms, 2), p.errors, p.errors == 0 and p.tbt_p99_ms <= slo_tbt_p99_ms)

        report.trials.append(measure(1, budget))
        # what one stream holds: its prompt's and output's blocks (a word is at most 4 tokens here: a bound)
        per_token = _bytes_per_token(Path(entry))
        tokens = prompt_words * 4 + output_tokens
        need = lambda n: n * -(-tokens // gen["block_size"]) * gen["block_size"] * per_token  # noqa: E731
        for n in CANDIDATES[1:]:
            if time.monotonic() - t_start > budget_s * 0.6:
                report.notes.append(f"the search stopped at {n} sequences: --budget-s {budget_s:g} spent")
                break
            if n > clients:
                break
            if need(n) > budget:
                report.notes.append(f"{n} sequences need ~{need(n) / 2**20:.0f} MiB of pool: over the budget")
                break
            say(f"trial: {n} sequences at once, pool {budget / 2**20:.0f} MiB")
            report.trials.append(measure(n, budget))
        ok = [t for t in report.trials if t.meets_slo]
        report.best = max(ok, key=lambda t: t.aggregate_tps) if ok else None
        if report.best is not None and (report.best.max_running, report.best.kv_cache_bytes) != \
                (baseline["max_running"], base_pool):
            ratios = []
            for k in range(pairs):
                say(f"confirmation pair {k + 1}/{pairs}")
                b = measure(baseline["max_running"], base_pool)
                c = measure(report.best.max_running, report.best.kv_cache_bytes)
                if b.aggregate_tps > 0:
                    ratios.append(c.aggregate_tps / b.aggregate_tps)
            if ratios:
                lo, hi = bootstrap_median_interval(ratios)
                report.confirmed = lo > 1 + margin
                verdict = (f"{sorted(ratios)[len(ratios) // 2]:.2f}x the baseline, 90% interval {lo:.2f}-{hi:.2f}: "
                           + ("confirmed" if report.confirmed else "not beyond noise (+ margin)"))
                report.confirmation = {"pairs": ratios, "interval": [lo, hi], "verdict": verdict}
        load_model(s, _config_with(cfg, s.name, baseline["max_running"], base_pool)[1])   # as it was
    report.spent_s = round(time.monotonic() - t_start, 1)
    return report


def _bytes_per_token(entry: Path) -> int:
    """The KV cache's bytes a token of the entry's decoder, from its MCP-IR's interface (no
    onnxruntime session: the server already has one)."""
    from mcp_compiler.llm.spec import find_llm
    from mcp_compiler.mcpir.reader import read_mcpir

    from .verify import _latest_version

    info = find_llm(read_mcpir(_latest_version(entry) / "model.mcpir"))
    if info is None or info.cache_bytes_per_token is None:
        raise InvalidModelError(entry, "its model is not a decoder with a fixed KV-cache shape")
    return info.cache_bytes_per_token


def apply_llm(entry: str | os.PathLike, best: LLMTrial) -> Path:
    from google.protobuf import text_format

    from mcp_compiler.files import follow_umask

    from .entry import read_config

    path = Path(entry) / "config.pbtxt"
    cfg = read_config(entry)
    new, _ = _config_with(cfg, cfg.name, best.max_running, best.kv_cache_bytes)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text_format.MessageToString(new), encoding="utf-8")
        follow_umask(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path

