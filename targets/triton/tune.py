"""`mcp-cli tune`: choose a served model's serving parameters for a latency SLO, on the local Triton.

Model Analyzer's job in one process. The entry's own config is measured first (the baseline); then
trials within the time budget, each a reload of the model with a config override (the repository
extension's `config` load parameter), measured at the one given load. The search is greedy by
stages, each stage starting from the best setting so far:

1. dynamic batching off, or on with a queue delay of 0, 100, 500 or 2000 us (an entry written
   without batching gets it when its model has one batch dim on every input and output: the
   config then loses that leading dim, max batch 8);
2. instance count and onnxruntime intra-op threads within the cores (instances x threads <= cores);
3. max and preferred batch size around the load (batching models);
4. after them, for a python-backend entry, the execution: the runtime profile
   (mcp_compiler.profile) runs on the entry's .mcpir in this process, in the time the budget has
   left (at most PROFILE_S), and every execution it keeps (one that compiles and stays within its
   accuracy budget: OpenVINO f32, bf16 on a CPU with native bf16) is a trial, served and measured
   like the others. A change of execution is applied, as any setting, only when the
   confirmation below finds it a win.

The best trial is the highest throughput whose p99 meets the SLO with no failed request (or, with
objective "latency", the lowest p99). Settings that are the same on this machine (intra-op threads
at or past the cores are onnxruntime's default; the queue delay of a model without batching) are
measured once. Each trial also records the serving processes' peak memory (the server and its
python-backend stubs, which grow with instances), and one last trial measures the chosen setting
with `inference_timeout_ms` at the SLO: the share of requests the queue policy then rejects
(timeout vs SLO attainment).

A search measures each setting once, on a shared, noisy machine: its best may be noise. So the best
and the baseline are then re-measured in alternating pairs (baseline first, then best first, ...;
CONFIRM_PAIRS of them), and the median of the paired ratios is reported with a bootstrap 90%
interval. The best is *confirmed* (and `--apply` writes it) only when the interval's lower end is
above 1 + margin (5% by default): a difference within the spread of the pairs is no difference.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from mcp_compiler.errors import McpError, UsageError

from .bench import Served, measure_points, served, still_serving
from .entry import Entry, int_parameter
from .lifecycle import load_model, unload_model
from .loadgen import WARMUP_S, Load, Point
from .procs import PeakRss
from .runtime import params as P

DELAYS_US = (0, 100, 500, 2000)
CONFIRM_PAIRS = 5
CONFIRM_MARGIN = 0.05
BOOTSTRAP = 2000
DEFAULT_MAX_BATCH = 8         # when tune turns batching on (convert's default)
LOAD_SECONDS = 3.0            # a reload, roughly (python backend + onnxruntime session)
PROFILE_S, PROFILE_MIN_S = 10.0, 3.0   # the execution stage's profile: its bound, and the least worth running


class SloNotMetError(McpError):
    """No trial met the latency SLO."""

    exit_code = 1


@dataclass(frozen=True)
class Setting:
    """The serving parameters a trial sets (config.pbtxt fields and the runtime's parameter)."""

    dynamic_batching: bool
    max_batch_size: int
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    instance_count: int = 1
    intra_op_threads: int = 0          # 0: onnxruntime's default (all cores)
    max_queue_size: int = 0            # 0: unbounded
    inference_timeout_ms: int = 0      # 0: none
    execution: str = "onnxruntime/f32"   # the python runtime's execution (mcp_execution / mcp_precision)
    budget: str = ""                   # the budget that execution was judged by (mcp_budget), as JSON

    @property
    def compiles_per_batch(self) -> bool:
        """OpenVINO with batching: a model compiled for each batch size the batcher keeps forming."""
        return self.execution.startswith("openvino") and self.max_batch_size > 0

    @classmethod
    def of(cls, cfg: Any) -> Setting:
        db = cfg.dynamic_batching if cfg.HasField("dynamic_batching") else None
        q = db.default_queue_policy if db is not None else None
        p = cfg.parameters
        execution = (f"{p[P.EXECUTION].string_value}/{p[P.PRECISION].string_value}"
                     if P.EXECUTION in p and P.PRECISION in p else "onnxruntime/f32")
        return cls(db is not None, cfg.max_batch_size, tuple(db.preferred_batch_size) if db else (),
                   db.max_queue_delay_microseconds if db else 0,
                   sum(g.count or 1 for g in cfg.instance_group) or 1, int_parameter(cfg, P.INTRA_OP_THREADS, digits=6),
                   q.max_queue_size if q else 0, (q.default_timeout_microseconds // 1000) if q else 0,
                   execution, p[P.BUDGET].string_value if P.BUDGET in p else "")

    def config(self, base: Any) -> Any:
        """`base` (a ModelConfig) with this setting. Turning batching on for an entry written
        without it drops the leading (batch) dim of every input and output; off, puts it back."""
        from tritonclient.grpc import model_config_pb2 as mc

        cfg = copy.deepcopy(base)
        if (base.max_batch_size > 0) != (self.max_batch_size > 0):
            for t in [*cfg.input, *cfg.output]:
                dims = list(t.dims[1:]) if self.max_batch_size > 0 else [-1, *t.dims]
                del t.dims[:]
                t.dims.extend(dims)
        cfg.max_batch_size = self.max_batch_size
        cfg.ClearField("dynamic_batching")
        if self.dynamic_batching:
            db = cfg.dynamic_batching
            db.SetInParent()
            db.preferred_batch_size.extend(self.preferred_batch_size)
            db.max_queue_delay_microseconds = self.max_queue_delay_us
            if self.max_queue_size:
                db.default_queue_policy.max_queue_size = self.max_queue_size
            if self.inference_timeout_ms:
                db.default_queue_policy.timeout_action = mc.ModelQueuePolicy.REJECT
                db.default_queue_policy.default_timeout_microseconds = self.inference_timeout_ms * 1000
        kind = cfg.instance_group[0].kind if cfg.instance_group else mc.ModelInstanceGroup.KIND_CPU
        cfg.ClearField("instance_group")
        cfg.instance_group.add(count=self.instance_count, kind=kind)
        if self.intra_op_threads:
            cfg.parameters[P.INTRA_OP_THREADS].string_value = str(self.intra_op_threads)
        elif P.INTRA_OP_THREADS in cfg.parameters:
            del cfg.parameters[P.INTRA_OP_THREADS]
        for key in (P.EXECUTION, P.PRECISION):
            if key in cfg.parameters:
                del cfg.parameters[key]
        if self.execution != "onnxruntime/f32":
            runtime, precision = self.execution.split("/")
            cfg.parameters[P.EXECUTION].string_value = runtime
            cfg.parameters[P.PRECISION].string_value = precision
            if self.budget:
                cfg.parameters[P.BUDGET].string_value = self.budget
        return cfg

    def to_dict(self) -> dict:
        d = asdict(self)
        d["preferred_batch_size"] = list(self.preferred_batch_size)
        return d

    def normalized(self, cores: int) -> Setting:
        """The same setting as this machine runs it: threads at or past the cores are onnxruntime's
        default (0), and without dynamic batching the queue fields do nothing."""
        s = self
        if s.intra_op_threads >= cores:
            s = replace(s, intra_op_threads=0)
        if not s.dynamic_batching:
            s = replace(s, preferred_batch_size=(), max_queue_delay_us=0, max_queue_size=0, inference_timeout_ms=0)
        return s


@dataclass
class Trial:
    setting: Setting
    point: Point | None
    peak_rss_mb: float | None
    error: str | None = None
    meets_slo: bool = False
    confirmation: dict | None = None   # the best only: the paired re-measurement against the baseline

    def to_dict(self) -> dict:
        p = self.point
        return {"config": self.setting.to_dict(), "label": label(self.setting), "confirmation": self.confirmation,
                "throughput": p.throughput if p else None,
                "p50_ms": p.p50_ms if p else None, "p90_ms": p.p90_ms if p else None,
                "p99_ms": p.p99_ms if p else None, "errors": p.errors if p else None,
                "rejected": p.rejected if p else None,
                "rejected_fraction": round(p.rejected / max(p.requests + p.errors, 1), 4) if p else None,
                "avg_batch": p.avg_batch if p else None, "queue_ms": p.queue_ms if p else None,
                "compute_ms": p.compute_ms if p else None, "peak_rss_mb": self.peak_rss_mb,
                "meets_slo": self.meets_slo, "error": self.error}


@dataclass
class TuneReport:
    model: str
    load: str
    slo_p99_ms: float
    objective: str
    baseline: Trial
    best: Trial | None
    trials: list[Trial]
    timeout_trial: Trial | None
    budget_s: float
    spent_s: float
    applied: str | None = None
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, dict] = field(default_factory=dict)   # the request: name -> {"shape", "dtype"}
    config: Any = field(default=None, repr=False)   # the entry's ModelConfig as tune read it (apply's base)

    @property
    def confirmed(self) -> bool:
        return bool(self.best and self.best.confirmation and self.best.confirmation["confirmed"])

    def to_dict(self) -> dict:
        return {"model": self.model, "load": self.load, "slo_p99_ms": self.slo_p99_ms, "objective": self.objective,
                "inputs": self.inputs, "confirmed": self.confirmed,
                "baseline": self.baseline.to_dict(), "best": self.best.to_dict() if self.best else None,
                "trials": [t.to_dict() for t in self.trials],
                "timeout_trial": self.timeout_trial.to_dict() if self.timeout_trial else None,
                "budget_s": self.budget_s, "spent_s": round(self.spent_s, 1), "applied": self.applied,
                "notes": self.notes}


def trial_seconds(window_s: float, windows: int = 3) -> float:
    """About what one trial takes: a reload, the warm-up, `windows` windows (three at the least,
    when the first three agree)."""
    return LOAD_SECONDS + WARMUP_S + windows * window_s


def confirm_seconds(window_s: float, pairs: int) -> float:
    """What the confirmation takes: two loads (baseline and best side by side), then `pairs` x 2
    fixed windows of 2 x window_s, each after the warm-up."""
    return 2 * LOAD_SECONDS + pairs * 2 * (WARMUP_S + 2 * window_s)


def _check_execution(e: Entry) -> None:
    """An execution the entry's runtime does not know is exit 2 naming its config (as verify)."""
    if e.config.backend != "python":
        return
    from .verify import load_runtime, recorded_execution

    params = e.config.parameters
    recorded_execution(load_runtime(e.local), e.local, (
        params[P.EXECUTION].string_value if P.EXECUTION in params else "onnxruntime",
        params[P.PRECISION].string_value if P.PRECISION in params else "f32"))


def tune(entry: str | os.PathLike, load: Load, slo_p99_ms: float, *, budget_s: float = 120.0,
         objective: str = "throughput", window_s: float = 1.0, max_windows: int = 6,
         inputs: str | os.PathLike | None = None, cores: int | None = None,
         progress: Callable[[str], None] | None = None, dims: dict[str, int] | None = None,
         pairs: int = CONFIRM_PAIRS, margin: float = CONFIRM_MARGIN) -> TuneReport:
    """Search the serving parameters of `entry` (DIR/NAME) at `load`, then confirm the best
    against the baseline in `pairs` alternating pairs (see the module docstring)."""
    from .bench import shapes_of

    if objective not in ("throughput", "latency"):
        raise UsageError(f"--objective must be throughput or latency, got {objective!r}")
    if slo_p99_ms <= 0:
        raise UsageError(f"--slo-p99-ms must be positive, got {slo_p99_ms}")
    if not 0 <= margin < 10:
        raise UsageError(f"--margin must be between 0 and 10, got {margin}")
    if pairs < 3:
        raise UsageError(f"--confirm-pairs must be at least 3, got {pairs}")
    need = trial_seconds(window_s)
    most = trial_seconds(window_s, max_windows)   # a trial that never settles: what the budget must still hold
    confirm = confirm_seconds(window_s, pairs)
    if budget_s < need:
        raise UsageError(f"--budget-s {budget_s:g} is too small for one trial (about {need:.0f} s: a reload "
                         f"and three {window_s:g} s windows)")
    cores = cores or os.cpu_count() or 1
    t0 = time.monotonic()
    say = progress or (lambda _msg: None)
    e = Entry.read(entry)   # once: the search, the confirmation and the profile use what was read
    _check_execution(e)   # before a server starts
    batchable = _batchable(e)
    notes: list[str] = []
    with served(e, None, inputs=inputs, dims=dims) as s:
        notes += s.notes
        original = copy.deepcopy(s.config)
        search = _Search(s, load, slo_p99_ms, objective, window_s, max_windows, cores, e)
        try:
            baseline = search.run(Setting.of(original), "baseline")
            say(_line(0, baseline, None, slo_p99_ms))
            def executions(start: Setting, *_: Any) -> list[Setting]:
                # last, in the time the other stages left: the profile is bounded by what remains
                from mcp_compiler.profile import openvino_version

                left = budget_s - (time.monotonic() - t0) - most - confirm
                if original.backend != "python":
                    return []
                if openvino_version() is None:
                    notes.append("OpenVINO is not installed: the execution is not searched "
                                 "(pip install 'mcp-cli[openvino]')")
                    return []
                if left < PROFILE_MIN_S:
                    notes.append("no time left in --budget-s to profile the executions (OpenVINO): not searched")
                    return []
                return _execution_settings(start, _executions(e, notes, say, min(PROFILE_S, left)), cores)

            for stage in (_batching, _instances, _batch_sizes, executions):
                for setting in stage(search.best_setting(baseline), cores, load, batchable):
                    if time.monotonic() - t0 + most + search.settle_seconds(setting) + confirm > budget_s:
                        break
                    if setting.normalized(cores) in search.seen:
                        search.skipped += setting not in search.raw   # the same on this machine, not a repeat
                        continue
                    trial = search.run(setting)
                    say(_line(len(search.trials) - 1, trial, search.best(), slo_p99_ms))
            best = search.best()
            if best is not None and best.setting.normalized(cores) != baseline.setting.normalized(cores):
                if time.monotonic() - t0 + confirm + search.settle_seconds(best.setting) <= budget_s + most:
                    best.confirmation = search.confirm(baseline, best, pairs, margin, say)
                else:
                    notes.append("no time left in --budget-s to confirm the best against the baseline: not confirmed")
            timeout_trial = None
            chosen = best or baseline
            if chosen.setting.dynamic_batching and time.monotonic() - t0 + most <= budget_s:
                timeout_trial = search.run(replace(chosen.setting, inference_timeout_ms=max(1, round(slo_p99_ms))),
                                           "timeout", rank=False)
                say(_timeout_line(timeout_trial))
        finally:
            # the model as it was (Ctrl-C included); the server stops on the way out of served()
            try:
                load_model(s, _json(original, s.name))
            except McpError:
                pass
    if search.trials and all(t.point is None for t in search.trials):
        notes.append("every trial failed to load or measure")
    if search.skipped:
        notes.append(f"{search.skipped} setting(s) not measured: the same on this machine as one measured "
                     f"({cores} cores: more intra-op threads are onnxruntime's default)")
    return TuneReport(s.name, load.label, slo_p99_ms, objective, baseline, best,
                      search.trials, timeout_trial, budget_s, time.monotonic() - t0, notes=notes,
                      inputs=shapes_of(s.feeds), config=original)


def bootstrap_median_interval(ratios: list[float], level: float = 0.90, n: int = BOOTSTRAP,
                              seed: int = 0) -> tuple[float, float]:
    """The `level` percentile interval of the median of `ratios`, by resampling them."""
    import numpy as np

    r = np.asarray(ratios, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(r[rng.integers(0, len(r), (n, len(r)))], axis=1)
    lo, hi = np.percentile(medians, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


class _Search:
    def __init__(self, s: Served, load: Load, slo: float, objective: str, window_s: float, max_windows: int,
                 cores: int = 1, entry: Entry | None = None) -> None:
        self.s, self.load, self.slo, self.objective, self.entry = s, load, slo, objective, entry
        self.window_s, self.max_windows, self.cores = window_s, max_windows, cores
        self.trials: list[Trial] = []
        self.seen: set[Setting] = set()    # as this machine runs them (Setting.normalized)
        self.raw: set[Setting] = set()
        self.skipped = 0
        self.base = copy.deepcopy(s.config)

    def measure(self, setting: Setting, seconds: float | None = None) -> Point:
        load_model(self.s, _json(setting.config(self.base), self.s.name))
        self._settle(self.s, setting)
        return measure_points(self.s, [self.load], window_s=self.window_s, max_windows=self.max_windows,
                              seconds=seconds, slo_ms=self.slo)[0]

    def settle_seconds(self, setting: Setting) -> float:
        """OpenVINO compiles a model for each batch size the batcher keeps forming, in the
        background (runtime._Static): the requests run slower while it takes the cores, so a
        window then measures those compiles, not the execution (a 97 MB ViT, cache cold: 0.5-1 s
        each, up to 8; a confirmation's twin measured 7 req/s in its first pair, 21-23 after).
        Such a setting is served unmeasured first until its windows agree (_settle); the budget
        counts the most that takes."""
        return self.max_windows * self.window_s if setting.compiles_per_batch else 0.0

    def _settle(self, served_as: Served, setting: Setting) -> None:
        if setting.compiles_per_batch:   # until three windows in a row agree, as a trial's point
            measure_points(served_as, [self.load], window_s=self.window_s, max_windows=self.max_windows,
                           slo_ms=self.slo)

    def run(self, setting: Setting, kind: str = "trial", rank: bool = True) -> Trial:
        self.seen.add(setting.normalized(self.cores))
        self.raw.add(setting)
        watch = PeakRss(self.s.server.proc.pid if self.s.server is not None else None)
        try:
            with watch:
                point = self.measure(setting)
            trial = Trial(setting, point, watch.peak_mb)
        except McpError as e:
            still_serving(self.s, f"trying {label(setting)}")   # a dead server ends the tune, with its own error
            trial = Trial(setting, None, watch.peak_mb, error=str(e))
        p = trial.point
        trial.meets_slo = bool(p and p.p99_ms is not None and p.p99_ms <= self.slo and p.errors == 0)
        if rank:
            self.trials.append(trial)
        return trial

    def confirm(self, baseline: Trial, best: Trial, pairs: int, margin: float, say: Callable[[str], None]) -> dict:
        """Baseline and best again, in `pairs` alternating pairs of fixed windows: the median of the
        paired ratios (best over baseline: throughput, or p99 the other way round for latency) and
        its bootstrap 90% interval; confirmed when the interval's lower end is above 1 + margin."""
        import dataclasses

        # both loaded at once, the best under a second name (the entry's files uploaded with its
        # config): the pairs then alternate between two ready models, no reload between them
        twin = dataclasses.replace(self.s, name=f"{self.s.name}__mcp_confirm")
        files = self.entry.files if self.entry is not None else {}
        rows = []
        try:
            load_model(self.s, _json(baseline.setting.config(self.base), self.s.name))
            load_model(twin, _json(best.setting.config(self.base), twin.name), files=files)
            self._settle(twin, best.setting)   # (the twin's folder has compiled nothing yet)
            for k in range(pairs):
                order = [("baseline", self.s), ("best", twin)]
                if k % 2:
                    order.reverse()   # alternate who goes first: drift on the machine hits both alike
                got = {}
                for who, served_as in order:
                    try:
                        got[who] = measure_points(served_as, [self.load], window_s=self.window_s,
                                                  seconds=2 * self.window_s, slo_ms=self.slo)[0]
                    except McpError as e:
                        got[who] = None
                        say(f"confirmation pair {k + 1}: {who} failed: {e}")
                b, x = got["baseline"], got["best"]
                if b is None or x is None or not b.throughput or not x.throughput or not b.p99_ms or not x.p99_ms:
                    continue
                ratio = x.throughput / b.throughput if self.objective == "throughput" else b.p99_ms / x.p99_ms
                rows.append({"baseline": b.throughput, "best": x.throughput, "baseline_p99_ms": b.p99_ms,
                             "best_p99_ms": x.p99_ms, "ratio": round(ratio, 4), "first": order[0][0]})
                say(f"confirmation pair {k + 1} of {pairs}: baseline {b.throughput:.0f} req/s (p99 {b.p99_ms} ms), "
                    f"best {x.throughput:.0f} req/s (p99 {x.p99_ms} ms): {ratio:.3f}x")
        except McpError as e:
            say(f"confirmation failed: {e}")
        finally:
            unload_model(twin)
        if len(rows) < 3:
            return {"pairs": rows, "median_ratio": None, "interval": None, "margin": margin, "confirmed": False,
                    "verdict": "too few pairs measured to confirm"}
        import statistics

        ratios = [r["ratio"] for r in rows]
        median = statistics.median(ratios)
        lo, hi = bootstrap_median_interval(ratios)
        confirmed = lo > 1 + margin
        verdict = (f"confirmed: {median:.3f}x the baseline (90% interval {lo:.3f}-{hi:.3f}, above 1 + {margin:g})"
                   if confirmed else
                   f"no configuration beat the baseline beyond noise: {median:.3f}x (90% interval {lo:.3f}-{hi:.3f} "
                   f"reaches below 1 + {margin:g})")
        say(verdict)
        return {"pairs": rows, "median_ratio": round(median, 4), "interval": [round(lo, 4), round(hi, 4)],
                "level": 0.90, "margin": margin, "confirmed": confirmed, "verdict": verdict}

    def _key(self, t: Trial) -> float:
        return t.point.throughput if self.objective == "throughput" else -(t.point.p99_ms or float("inf"))

    def best(self) -> Trial | None:
        ok = [t for t in self.trials if t.meets_slo] if self.objective == "throughput" else \
            [t for t in self.trials if t.point and t.point.errors == 0 and t.point.p99_ms is not None]
        return max(ok, key=self._key) if ok else None

    def best_setting(self, baseline: Trial) -> Setting:
        """Where the next stage starts: the best so far, or (none met the SLO) the lowest p99."""
        b = self.best()
        if b is not None:
            return b.setting
        measured = [t for t in self.trials if t.point and t.point.p99_ms is not None]
        return min(measured, key=lambda t: t.point.p99_ms).setting if measured else baseline.setting


def _executions(entry: Entry, notes: list[str], say: Callable[[str], None], seconds: float) -> list[tuple[str, str]]:
    """The executions worth a trial: those the runtime profile keeps on this machine (they
    compile and meet their accuracy budget), as (runtime/precision, budget JSON), the fastest
    in the profile first (the budget may end the stage after one: the ViT's OpenVINO bf16,
    twice its f32's speed, went untried behind it)."""
    import json as _json_mod

    from mcp_compiler import profile as prof

    from .verify import execution_loader

    say("profiling the executions this machine has (accuracy against onnxruntime fp32)")
    p = prof.choose(entry.model(), execution_loader(entry.local), seconds=seconds)
    kept = [(c.key, _json_mod.dumps(c.budget, sort_keys=True) if c.budget else "")
            for c in sorted((c for c in p.candidates if not c.dropped),
                            key=lambda c: c.ratio if c.ratio is not None else 1.0)]
    for c in p.candidates:
        if c.dropped:
            notes.append(f"execution {c.key} not tried: {c.dropped}")
    return kept


def _batching(start: Setting, cores: int, load: Load, batchable: bool) -> list[Setting]:
    if start.max_batch_size <= 0:
        if not batchable:
            return []
        # an entry written without batching whose model has a batch dim everywhere: batching on
        start = replace(start, max_batch_size=DEFAULT_MAX_BATCH)
        return [replace(start, dynamic_batching=True, max_queue_delay_us=d) for d in DELAYS_US]
    out = [replace(start, dynamic_batching=False, preferred_batch_size=(), max_queue_delay_us=0)]
    out += [replace(start, dynamic_batching=True, max_queue_delay_us=d) for d in DELAYS_US]
    return out


def _batchable(entry: Entry) -> bool:
    """Whether the entry's model can take batching: one batch symbol at axis 0 of every input
    and output (config.batch_blocker), each of rank 2 or more (dims left after the batch)."""
    from .config import batch_blocker, interface

    if entry.config.max_batch_size > 0:
        return True
    model = entry.model()
    ins, outs = interface(model)
    return batch_blocker(model) is None and all(len(v.type.shape) >= 2 for v in [*ins, *outs])


def _instances(start: Setting, cores: int, load: Load, batchable: bool) -> list[Setting]:
    out = []
    for n in sorted({1, 2, cores} - {0}):
        if n > cores:
            continue
        for threads in sorted({1, max(1, cores // n)}):
            out.append(replace(start, instance_count=n, intra_op_threads=threads))
    return out


def _execution_settings(start: Setting, executions: list[tuple[str, str]], cores: int) -> list[Setting]:
    """Each execution other than the start's, at the start's instances and threads and at one
    instance on every core: the split chosen for onnxruntime need not suit OpenVINO, whose
    latency hint runs one stream on all cores (the ViT in bf16 on 2 instances x 1 thread served
    12.6 req/s at concurrency 4 here, onnxruntime's best 12.7)."""
    out = []
    for x, b in executions:
        if x == start.execution:
            continue
        for s in (replace(start, execution=x, budget=b),
                  replace(start, execution=x, budget=b, instance_count=1, intra_op_threads=cores)):
            if all(s.normalized(cores) != o.normalized(cores) for o in out):
                out.append(s)
    return out


def _batch_sizes(start: Setting, cores: int, load: Load, batchable: bool) -> list[Setting]:
    if not start.dynamic_batching or start.max_batch_size <= 1:
        return []
    clients = load.concurrency or 8
    sizes = sorted({b for b in (max(1, start.max_batch_size // 2), start.max_batch_size * 2, clients)
                    if 1 <= b <= 1024} - {start.max_batch_size})
    out = [replace(start, max_batch_size=b, preferred_batch_size=tuple(p for p in start.preferred_batch_size if p <= b))
           for b in sizes]
    pref = min(clients, start.max_batch_size)
    if pref > 1 and start.preferred_batch_size != (pref,):
        out.append(replace(start, preferred_batch_size=(pref,)))
    return out


def _json(cfg: Any, name: str) -> str:
    from google.protobuf import json_format

    cfg = copy.deepcopy(cfg)
    cfg.name = name
    return json_format.MessageToJson(cfg, preserving_proto_field_name=True)


def _line(k: int, t: Trial, best: Trial | None, slo: float) -> str:
    p = t.point
    what = "baseline" if k == 0 else f"trial {k}"
    if p is None:
        return f"{what}: {describe(t.setting)}: failed: {t.error}"
    ok = "meets" if t.meets_slo else "misses"
    tail = f"; best so far {best.point.throughput:.0f} req/s at p99 {best.point.p99_ms} ms" if best else ""
    return (f"{what}: {describe(t.setting)}: {p.throughput:.0f} req/s, p99 {p.p99_ms} ms ({ok} {slo:g} ms)"
            f"{', ' + str(p.errors) + ' errors' if p.errors else ''}{tail}")


def _timeout_line(t: Trial) -> str:
    """The timeout trial's progress line, its share rejected as the summary says it."""
    what = f"timeout trial: inference_timeout_ms {t.setting.inference_timeout_ms}"
    if t.point is None:
        return f"{what}: failed: {t.error}"
    return f"{what}: {t.to_dict()['rejected_fraction']:.1%} of requests rejected"


def label(s: Setting) -> str:
    """A setting in a few characters, for plots: `b16 d100us i2t1` (max batch 16, batching with a
    100 us queue delay, 2 instances of 1 thread); `nb` without batching, `tall` all cores."""
    db = f"b{s.max_batch_size} d{s.max_queue_delay_us}us" if s.dynamic_batching else \
        (f"b{s.max_batch_size} nb" if s.max_batch_size > 0 else "nb")
    pref = f" p{'/'.join(map(str, s.preferred_batch_size))}" if s.preferred_batch_size else ""
    ex = "" if s.execution == "onnxruntime/f32" else f" {s.execution.replace('openvino', 'ov')}"
    return f"{db}{pref} i{s.instance_count}t{s.intra_op_threads or 'all'}{ex}"


def describe(s: Setting) -> str:
    db = f"batching delay {s.max_queue_delay_us} us" if s.dynamic_batching else "no batching"
    pref = f" preferred {list(s.preferred_batch_size)}" if s.preferred_batch_size else ""
    thr = f" x {s.intra_op_threads} threads" if s.intra_op_threads else ""
    ex = "" if s.execution == "onnxruntime/f32" else f", {s.execution}"
    return f"{db}, max batch {s.max_batch_size}{pref}, {s.instance_count} instance(s){thr}{ex}"


def apply(entry: str | os.PathLike, setting: Setting, base: Any = None) -> Path:
    """Rewrite DIR/NAME/config.pbtxt with `setting` over `base` (the config tune measured; read
    from the entry when None), atomically (through the ModelConfig protobuf)."""
    from google.protobuf import text_format

    from mcp_compiler.files import follow_umask

    from .entry import read_config

    path = Path(entry) / "config.pbtxt"
    cfg = base if base is not None else read_config(entry)
    text = text_format.MessageToString(setting.config(cfg))
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        follow_umask(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_report(report: TuneReport, path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
