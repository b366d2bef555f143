"""Hardware-aware execution: what this machine computes with, and which backend serves a model
fastest within its accuracy budget.

`machine()` reads the CPU's instruction sets (AVX2, AVX-512, VNNI, AVX512_BF16, AMX), cores,
memory, onnxruntime's execution providers and whether OpenVINO is installed. `candidates()` turns
that into the executions worth measuring for a model: onnxruntime fp32 (today's), OpenVINO f32,
OpenVINO bf16 where the CPU computes bf16 natively (AMX or AVX512_BF16), and onnxruntime's CUDA
and TensorRT providers where a GPU offers them. `choose()` runs each candidate as the served
runtime runs it (mcp_runtime.MCPIRModel on the entry's .mcpir), on inputs the model accepts
(mcp_compiler.inputs):

- accuracy: each candidate's outputs against onnxruntime fp32 on the selection samples, within its
  budget (a precision change: cosine >= 0.999 and relative error <= 0.05 by default; an engine
  change at f32: cosine >= 0.99999 and relative error <= 1e-3); a candidate that does not load
  or compile (an op OpenVINO lacks) or misses its budget is dropped, with the reason;
- speed: warm-up, then rounds in which every candidate runs once, in rotating order (paired,
  interleaved); each round gives a candidate a ratio to onnxruntime's time in the same round. A
  candidate is faster only when its ratios' 90th percentile is under 1: a difference within the
  spread of the pairs is no difference, and ties keep onnxruntime;
- the fastest is judged again on samples the choice never saw (other random draws, at the
  request's sizes and at the sizes `verify` checks at): outside its budget there, the next fastest
  is judged, and so on down to onnxruntime.

The profile is bounded by `seconds` (loading and compiling included); what it could not measure
in time is dropped with that reason.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import UsageError
from .inputs import REQUEST_LENGTH  # a free dim of the measured request (bench's default length) ...

RUNTIMES = ("auto", "onnxruntime", "openvino")
PRECISIONS = ("auto", "f32", "bf16")
SELECT_SAMPLES = 3        # samples the choice is made on (accuracy)
JUDGE_SAMPLES = 8         # other samples the winner is judged on
SELECT_SEED, JUDGE_SEED = 11, 1009   # disjoint draws: the judge never sees a selection sample
CHECK_SEED = 4099         # the judge's samples at the checks' sizes (verify draws its own with accuracy.JUDGE_SEED)
MIN_ROUNDS, MAX_ROUNDS = 5, 200
IMAGE_SIDE = 224          # ... and an image's free side (a float input [N, C, H, W] with C of 1, 3 or 4)
ATOL = 1e-4               # an output within this of the reference everywhere is equal (any cosine)
# Budgets against onnxruntime fp32: a lower precision, and another engine at the same precision.
PRECISION_BUDGET = {"cos": 0.999, "rel": 0.05}
ENGINE_BUDGET = {"cos": 0.99999, "rel": 1e-3}
_ISA = {"avx2": "avx2", "avx512f": "avx512", "avx512_vnni": "vnni", "avx_vnni": "vnni",
        "avx512_bf16": "avx512_bf16", "avx512_fp16": "avx512_fp16", "amx_bf16": "amx_bf16",
        "amx_int8": "amx_int8", "amx_tile": "amx_tile"}


@dataclass
class Machine:
    cpu: str = ""
    isa: list[str] = field(default_factory=list)     # of _ISA's names, in its order
    cores: int = 1
    memory_bytes: int | None = None
    ort_providers: list[str] = field(default_factory=list)
    openvino: str | None = None                      # its version, None: not installed
    gpus: list[str] = field(default_factory=list)

    @property
    def native_bf16(self) -> bool:
        return "amx_bf16" in self.isa or "avx512_bf16" in self.isa

    def to_dict(self) -> dict:
        return asdict(self)


def machine() -> Machine:
    """This machine, read from /proc and the installed runtimes (nothing is started)."""
    m = Machine(cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and not m.cpu:
            m.cpu = value.strip()
    m.isa = list(dict.fromkeys(name for flag, name in _ISA.items() if flag in flags))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                m.memory_bytes = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import onnxruntime as ort

    m.ort_providers = list(ort.get_available_providers())
    m.openvino = openvino_version()
    if "CUDAExecutionProvider" in m.ort_providers:
        m.gpus = _nvidia_gpus()
    return m


def openvino_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("openvino")
    except Exception:  # noqa: BLE001 - not installed (PackageNotFoundError), or a broken install
        return None


def _nvidia_gpus() -> list[str]:
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]


@dataclass
class Candidate:
    runtime: str                       # onnxruntime | openvino | onnxruntime-cuda | onnxruntime-tensorrt
    precision: str                     # f32 | bf16 | f16
    budget: dict[str, float] = field(default_factory=dict)
    latency_ms: float | None = None    # median over the rounds
    ratio: float | None = None         # median of the paired ratios to onnxruntime fp32
    ratio_spread: list[float] | None = None   # their 10th and 90th percentiles
    accuracy: dict[str, float] | None = None  # the worst output: cosine, rel (selection samples)
    judged: dict[str, float] | None = None    # the same on the judging samples (the winner)
    chosen: bool = False
    dropped: str | None = None

    @property
    def key(self) -> str:
        return f"{self.runtime}/{self.precision}"

    def to_dict(self) -> dict:
        return asdict(self)


def budget_for(precision: str) -> dict[str, float]:
    """What an execution at `precision` is judged by against onnxruntime fp32 (a copy)."""
    return dict(ENGINE_BUDGET if precision == "f32" else PRECISION_BUDGET)


def candidates(m: Machine, runtime: str = "auto", precision: str = "auto") -> list[Candidate]:
    """The executions worth measuring on `m` for what the user asked (onnxruntime fp32 first:
    the baseline every other one is measured and checked against)."""
    if runtime not in RUNTIMES:
        raise UsageError(f"--runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if precision not in PRECISIONS:
        raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if runtime == "onnxruntime" and precision == "bf16":
        raise UsageError("--precision bf16 runs on OpenVINO: --runtime openvino (or auto)")
    out = [Candidate("onnxruntime", "f32")]
    if runtime in ("auto", "openvino"):
        if m.openvino is None:
            if runtime == "openvino":
                raise UsageError("--runtime openvino: OpenVINO is not installed (pip install 'mcp-cli[openvino]')")
        else:
            if precision in ("auto", "f32"):
                out.append(Candidate("openvino", "f32", budget_for("f32")))
            if precision == "bf16" or (precision == "auto" and m.native_bf16):
                out.append(Candidate("openvino", "bf16", budget_for("bf16")))
    if runtime == "auto" and precision in ("auto", "f32"):
        if "CUDAExecutionProvider" in m.ort_providers and m.gpus:
            out.append(Candidate("onnxruntime-cuda", "f32", budget_for("f32")))
        if "TensorrtExecutionProvider" in m.ort_providers and m.gpus:
            out.append(Candidate("onnxruntime-tensorrt", "f32", budget_for("f32")))
            if precision == "auto":
                out.append(Candidate("onnxruntime-tensorrt", "f16", budget_for("f16")))
    return out


@dataclass
class Profile:
    machine: dict
    candidates: list[Candidate]
    rounds: int = 0
    seconds: float = 0.0
    select_samples: int = 0
    judge_samples: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def chosen(self) -> Candidate:
        return next(c for c in self.candidates if c.chosen)

    def to_dict(self) -> dict:
        return {"machine": self.machine, "candidates": [c.to_dict() for c in self.candidates],
                "rounds": self.rounds, "seconds": round(self.seconds, 3), "select_samples": self.select_samples,
                "judge_samples": self.judge_samples, "chosen": self.chosen.key, "notes": self.notes}


Loader = Callable[[Candidate], Callable[[dict], list]]


def choose(model, load: Loader, *, runtime: str = "auto", precision: str = "auto",  # noqa: ANN001 - an IR Model
           seconds: float = 20.0, m: Machine | None = None, clock: Callable[[], float] = time.perf_counter,
           dims: dict[str, int] | None = None, user: list[dict] | None = None) -> Profile:
    """Measure the candidates for `model` (its interface makes the inputs); `load(candidate)`
    gives a feeds -> outputs function as the served runtime runs it, or raises. With `runtime`
    or `precision` forced, only those candidates can win (onnxruntime fp32 is still the
    reference). `user`: the user's own samples (--inputs), judged on beside the random ones: a
    winner that misses its budget on them is dropped as on any judging sample."""
    start = clock()
    m = m or machine()
    cands = candidates(m, runtime, precision)
    prof = Profile(m.to_dict(), cands)
    base = cands[0]
    runs: dict[str, Callable] = {}
    for c in cands:
        try:
            runs[c.key] = load(c)
        except Exception as e:  # noqa: BLE001 - a candidate that does not load or compile is dropped
            c.dropped = f"does not load: {_first_line(e)}"
    if base.key not in runs:
        raise UsageError(f"the model does not load in onnxruntime: {base.dropped}")
    # each run of the checks bounded too (where the loader can end one): not only the timing
    bound = max(RUN_BOUND_MIN_S, RUN_BOUND_TIMES * seconds)
    checked = {k: _bounded(fn, bound) for k, fn in runs.items()}
    try:
        p, checks = _request_plan(model, dims or {}, checked[base.key], prof)
        made = clock()
        select = [_request(model, p, SELECT_SEED)]
        n_select, n_judge = _sample_counts(clock() - made, seconds, prof)
        select += [_request(model, p, SELECT_SEED + k) for k in range(1, n_select)]
        prof.select_samples, prof.judge_samples = len(select), 2 * n_judge
        want = [checked[base.key](f) for f in select]
    except TimeoutError as e:   # onnxruntime fp32 itself: nothing to compare with; it stays
        for c in cands[1:]:
            c.dropped = c.dropped or "not measured: a run of the model on onnxruntime did not end"
        prof.notes.append(f"{_first_line(e)} on onnxruntime fp32 (the reference): the executions were not "
                          "profiled; onnxruntime fp32 kept")
        base.chosen = True
        prof.seconds = clock() - start
        return prof
    for c in cands[1:]:
        if c.dropped:
            continue
        try:
            c.accuracy = _accuracy(want, [checked[c.key](f) for f in select])
        except TimeoutError as e:
            _never_ended(c, e, cands, prof)
            break
        except Exception as e:  # noqa: BLE001 - fails on inputs onnxruntime runs
            c.dropped = f"fails to run: {_first_line(e)}"
            continue
        if not _within(c.accuracy, c.budget):
            c.dropped = f"outside its budget {_budget_text(c.budget)}: {_acc_text(c.accuracy)}"
    live = [c for c in cands if not c.dropped]
    _time(live, runs, select, prof, start, seconds, clock, prof.judge_samples)
    reference, judge = None, []
    for c in _ranked(live, base, prof, runtime, precision):
        if c is base:
            break
        try:
            if not judge:   # made only where a candidate is judged: large inputs take long to draw
                judge = [_request(model, p, JUDGE_SEED + k) for k in range(n_judge)] + _check_samples(
                    model, checks, n_judge) + list(user or [])
                prof.judge_samples = len(judge)
            reference = reference or [checked[base.key](f) for f in judge]
            c.judged = _accuracy(reference, [checked[c.key](f) for f in judge])
        except TimeoutError as e:
            _never_ended(c, e, cands, prof)
            break
        except Exception as e:  # noqa: BLE001 - fails at a size the selection did not run
            c.dropped = f"fails to run on the judging samples: {_first_line(e)}"
            continue
        if _within(c.judged, c.budget):
            c.chosen = True
            break
        c.dropped = (f"outside its budget {_budget_text(c.budget)} on the {len(judge)} judging samples: "
                     f"{_acc_text(c.judged)}")
        prof.notes.append(f"{c.key} was faster but missed its budget on samples the choice never saw")
    if not any(c.chosen for c in cands):
        base.chosen = True
    prof.seconds = clock() - start
    return prof


RUN_BOUND_MIN_S, RUN_BOUND_TIMES = 60.0, 10   # one checking run: at least a minute, 10x the profile's bound


def _never_ended(c: Candidate, e: BaseException, cands: list[Candidate], prof: Profile) -> None:
    """A candidate's run did not end in its bound: it is dropped and so is every candidate not yet
    chosen (a run OpenVINO cannot stop keeps its cores busy: nothing measured after it would be
    fair); onnxruntime fp32 stays."""
    c.dropped = f"its run did not end: {_first_line(e)}"
    for other in cands[1:]:
        if other is not c and not other.dropped:
            other.dropped = f"not measured: a run on {c.key} did not end"
    prof.notes.append(f"a run on {c.key} did not end ({_first_line(e)}): the profile stopped there; "
                      "onnxruntime fp32 kept")


def _bounded(run: Callable, seconds: float) -> Callable:
    """`run` ended after `seconds` (TimeoutError) where the loader gave it a way to (`run.within`:
    the runtime's run_within, which stops onnxruntime or cancels OpenVINO's request)."""
    within = getattr(run, "within", None)
    return run if within is None else (lambda feeds: within(feeds, seconds))


def request(model, run: Callable, dims: dict[str, int] | None = None, seed: int = SELECT_SEED) -> dict:  # noqa: ANN001
    """One request as the profile measures it (batch 1, free sizes at their request sizes): what
    a benchmark sends to compare executions on the same footing."""
    return _request(model, _request_plan(model, dims or {}, run, Profile({}, []))[0], seed)


def _request(model, p, seed: int) -> dict:  # noqa: ANN001 - an IR Model, an InputPlan
    """One sample of plan `p`, batch 1 where the model batches."""
    from .inputs import make

    batch = 1 if any(sh and isinstance(sh[0], str) for sh in p.shapes.values()) else None
    return make(model, p, np.random.default_rng(seed), batch=batch)


def _request_plan(model, dims: dict[str, int], run: Callable, prof: Profile):  # noqa: ANN001, ANN202
    """The request a served model gets, not the smallest one the checks use: batch 1, and the
    symbols no op ties to a size (an image side, a sequence length) at REQUEST_LENGTH where the
    model accepts it (bench's default request); and the checks' own plan (the sizes `verify`
    checks at), which it starts from. Both InputPlans."""
    from .errors import McpError
    from .inputs import plan, probe

    p = plan(model, dims, fold=False)
    free = [s for s in p.free if s not in dims and not any(sh and sh[0] == s for sh in p.shapes.values())]
    if free:
        sides = {d for sh in p.shapes.values() if len(sh) == 4 and sh[1] in (1, 3, 4) for d in sh[2:]
                 if isinstance(d, str)}
        sizes = {s: IMAGE_SIDE if s in sides else REQUEST_LENGTH for s in free}
        try:
            q = plan(model, {**sizes, **dims}, fold=False)
            probe(model, q, run)
            prof.notes.append(f"measured at {', '.join(f'{k}={v}' for k, v in sizes.items())}, batch 1 "
                              "(--warmup-dims sets the request's sizes)")
            return q, p
        except McpError:
            pass
    probe(model, p, run)
    return p, p


SAMPLE_SHARE = 0.25   # of --profile-seconds: what drawing the samples may take before there are fewer


def _sample_counts(per: float, seconds: float, prof: Profile) -> tuple[int, int]:
    """How many selection and judging samples (each judging count twice: at the request's sizes
    and at the checks'): the defaults, fewer where drawing one took `per` seconds and all of them
    would take more than SAMPLE_SHARE of the bound (a 200 MB input takes 0.8 s to draw here)."""
    full = SELECT_SAMPLES + 2 * JUDGE_SAMPLES
    if per * full <= SAMPLE_SHARE * seconds:
        return SELECT_SAMPLES, JUDGE_SAMPLES
    n = max(3, int(SAMPLE_SHARE * seconds / max(per, 1e-9)))
    n_select = min(SELECT_SAMPLES, max(1, n // 5))
    n_judge = min(JUDGE_SAMPLES, max(1, (n - n_select) // 2))
    prof.notes.append(f"a request's inputs took {per:.2f} s to draw: {n_select} selection and {2 * n_judge} "
                      f"judging samples, not {SELECT_SAMPLES} and {2 * JUDGE_SAMPLES} (--profile-seconds gives more)")
    return n_select, n_judge


def _check_samples(model, q, n: int = JUDGE_SAMPLES) -> list[dict]:  # noqa: ANN001 - an IR Model, the checks' InputPlan
    """`n` samples at the sizes `verify` checks an entry at (the checks' plan, not the
    request's), drawn with a seed of the profile's own: a precision that holds at the request's
    sizes and not at the checks' (ppocr_cls in bf16: cosine 0.9998 at 224x224, 0.9987 at the checks'
    small sides) would pass here and fail `verify` on fresh samples. [] where the checks' plan does
    not make samples (a size the model refuses: the request's samples judge alone)."""
    from .errors import McpError
    from .inputs import make

    try:
        rng = np.random.default_rng(CHECK_SEED)
        return [make(model, q, rng) for _ in range(n)]
    except McpError:
        return []


def _time(live: list[Candidate], runs: dict, samples: list[dict], prof: Profile, start: float, seconds: float,
          clock: Callable[[], float], judge_runs: int = 0) -> None:
    for c in live:   # warm-up: the first runs pay allocations and kernel selection
        for f in samples[:2]:
            runs[c.key](f)
    times: dict[str, list[float]] = {c.key: [] for c in live}
    k, round_s = 0, 0.0
    # the judging after the rounds runs the winner and onnxruntime on the judging samples: kept within the bound too
    while k < MAX_ROUNDS and (k < MIN_ROUNDS or clock() - start + judge_runs * round_s < seconds):
        order = live[k % len(live):] + live[:k % len(live)]   # rotating: no candidate always runs first
        f = samples[k % len(samples)]
        t_round = clock()
        for c in order:
            t = clock()
            runs[c.key](f)
            times[c.key].append(clock() - t)
        round_s = max(round_s, clock() - t_round)
        k += 1
    prof.rounds = k
    base = times[live[0].key]
    for c in live:
        t = np.asarray(times[c.key])
        c.latency_ms = round(float(np.median(t)) * 1e3, 4)
        ratios = t / np.asarray(base)
        c.ratio = round(float(np.median(ratios)), 4)
        c.ratio_spread = [round(float(np.percentile(ratios, 10)), 4), round(float(np.percentile(ratios, 90)), 4)]
    if k < MIN_ROUNDS * 2 and clock() - start > seconds:
        prof.notes.append(f"the time bound ({seconds:g} s) allowed {k} rounds; --profile-seconds gives more")


def _ranked(live: list[Candidate], base: Candidate, prof: Profile, runtime: str, precision: str) -> list[Candidate]:
    """The candidates that may win, best first, ending with onnxruntime fp32 where it may: with
    `runtime` auto, those whose paired ratios are under 1 through their spread, by ratio (ties keep
    onnxruntime); forced runtime or precision: those allowed, by latency."""
    allowed = [c for c in live if (runtime in ("auto", c.runtime)) and (precision in ("auto", c.precision))]
    if runtime == "onnxruntime" or not allowed or allowed == [base]:
        return [base]
    if runtime != "auto" or precision != "auto":
        return sorted(allowed, key=lambda c: c.latency_ms) + [base]
    faster = [c for c in allowed if c is not base and c.ratio_spread and c.ratio_spread[1] < 1.0]
    if not faster:
        prof.notes.append("no candidate was faster than onnxruntime fp32 beyond the spread of the paired runs: "
                          "onnxruntime kept")
    return sorted(faster, key=lambda c: c.ratio) + [base]


def _accuracy(want: list[list], got: list[list]) -> dict[str, float]:
    """The worst output over the samples (reference.compare's numbers): cosine (lowest), rel =
    ||got - want|| / ||want|| (highest), max abs. An output within ATOL of the reference
    everywhere counts as equal: the cosine of ~1e-7 probabilities says nothing."""
    from .reference import compare

    cos, rel, max_abs = 1.0, 0.0, 0.0
    for w_outs, g_outs in zip(want, got):
        for w, g in zip(w_outs, g_outs):
            diff, _, c, _, _, _, r = compare(w, g, 0.0, ATOL)
            max_abs = max(max_abs, diff)
            if diff > ATOL:
                cos, rel = min(cos, c), max(rel, r)
    return {"cos": round(cos, 7), "rel": float(f"{rel:.4g}"), "max_abs": float(f"{max_abs:.4g}")}


def _within(acc: dict[str, float], budget: dict[str, float]) -> bool:
    return acc["cos"] >= budget.get("cos", -1.0) and acc["rel"] <= budget.get("rel", float("inf"))


def _budget_text(budget: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in budget.items())


def _acc_text(acc: dict[str, float]) -> str:
    return f"cosine {acc['cos']:.6f}, relative error {acc['rel']:.3g}"


def _first_line(e: BaseException) -> str:
    from .errors import one_line

    return one_line(str(e), 300) or type(e).__name__
