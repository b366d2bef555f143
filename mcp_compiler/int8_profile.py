"""int8 as a candidate of the runtime profile (`--runtime auto --calibration-data DIR`, no
`--quantize`): the model is quantized to int8 (the quantize-int8 pass, its search included) beside
the float pipeline, and the entry becomes the int8 one only where it is both faster and within
its budget; otherwise the float entry is emitted and the report says why int8 was not taken.

- samples: the calibration folder's samples quantize (the pass splits them again: even ones
  calibrate, odd ones select); the candidate is judged on samples that did neither: `--inputs`
  when given, else every HOLDOUT_EVERY-th calibration sample, held out of the pass;
- accuracy: against onnxruntime on the original as the user runs it, on the judging samples, by
  the budget (`--accuracy-budget`, default int8's, judged per slice: mcp_compiler.accuracy);
- speed: both models as the served runtime runs them (mcp_runtime.MCPIRModel on their .mcpir,
  prepacked, onnxruntime's spinning off as in the profile), on the real samples, in paired rounds
  of rotating order (mcp_compiler.profile's); int8 is faster only when the 90th percentile of its
  paired ratios to float is under 1 (a difference within the spread of the pairs is no
  difference: float stays).

OpenVINO then measures the chosen model as before (the engine profile runs on the emitted entry).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import McpError, one_line
from .ir.graph import Model
from .profile import Candidate, Profile, _time

HOLDOUT_EVERY = 3      # without --inputs: samples 2, 5, 8, ... judge; the rest quantize
MIN_QUANTIZE = 2       # the pass needs one sample to calibrate and one to select


@dataclass
class Int8Choice:
    chosen: bool = False
    dropped: str | None = None
    judged_on: str = ""
    judge_samples: int = 0
    quantize_samples: int = 0
    float_ms: float | None = None       # medians over the paired rounds
    int8_ms: float | None = None
    ratio: float | None = None          # int8 / float, the median of the paired ratios
    ratio_spread: list[float] | None = None   # their 10th and 90th percentiles
    rounds: int = 0
    seconds: float = 0.0
    accuracy: dict | None = None        # the worst output on the judging samples (accuracy report's numbers)
    budget: dict = field(default_factory=dict)
    int8: dict | None = None            # the pass's own record: method, kept nodes, trials
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        if self.chosen:
            return (f"--runtime auto: int8 chosen ({1 / self.ratio:.2f}x float's speed, paired ratios "
                    f"{self.ratio_spread[0]:.2f}-{self.ratio_spread[1]:.2f} over {self.rounds} rounds; within "
                    f"its budget on {self.judge_samples} samples that neither calibrated nor selected: {self.judged_on})")
        return f"--runtime auto: int8 measured, not taken: {self.dropped}"


def wanted(options) -> bool:  # noqa: ANN001 - CompileOptions
    """`--runtime auto` (precision auto) with --calibration-data and no --quantize, on the python backend."""
    p = options.target.params
    return (options.quantize is None and options.accuracy.calibration_data is not None
            and getattr(p, "runtime", None) == "auto" and getattr(p, "precision", "auto") == "auto"
            and getattr(p, "backend", None) == "python")


def split(samples: list[dict], held_out: list[dict] | None) -> tuple[list[dict], list[dict]]:
    """(quantize, judge): `held_out` (the --inputs samples) judges where given; else every
    HOLDOUT_EVERY-th calibration sample is held out of the quantization."""
    if held_out is not None:
        return list(samples), list(held_out)
    judge = samples[HOLDOUT_EVERY - 1::HOLDOUT_EVERY]
    quantize = [s for i, s in enumerate(samples) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
    return quantize, judge


def judge(reference, model_q: Model, samples: list[dict], label: str, budget: dict,  # noqa: ANN001
          choice: Int8Choice) -> bool:
    """The int8 model against onnxruntime on the original (`reference`), on `samples`, by
    `budget`: within it or not (the reason in choice.dropped)."""
    from .accuracy import check_budget, measure

    acc = measure(reference, model_q, samples, label)
    try:
        check_budget(acc, budget)
        return True
    except McpError:
        choice.dropped = f"outside its budget on {label}: {acc.violations[0]}"
        return False
    finally:
        choice.accuracy = _worst(acc.to_dict())


def _worst(acc: dict) -> dict:
    outs = acc.get("outputs") or []
    keys = ("cosine", "rel_error", "slice_rel_error", "worst_slice", "top1_agreement", "exact_match")
    return {"outputs": [{"name": o["name"], **{k: o.get(k) for k in keys if o.get(k) is not None}} for o in outs],
            "inputs": acc.get("inputs"), "samples": acc.get("samples")}


def time_pair(model_f: Model, model_q: Model, samples: list[dict], seconds: float, choice: Int8Choice,
              clock: Callable[[], float] = time.perf_counter) -> None:
    """Float and int8 as the served runtime runs them, in paired rounds on `samples` (bounded by
    `seconds`); fills the choice's times and ratios."""
    from .mcpir.writer import write_mcpir
    from .session import quiet_options
    from .targets.triton.emit import write_runtime
    from .targets.triton.verify import load_runtime

    start = clock()
    with tempfile.TemporaryDirectory(prefix="mcp-int8-") as tmp:
        write_runtime(Path(tmp))   # the runtime an entry carries, as served
        MCPIRModel = load_runtime(Path(tmp)).MCPIRModel
        runs = {}
        for key, m in (("onnxruntime/f32", model_f), ("onnxruntime/int8", model_q)):
            path = Path(tmp) / f"{key.split('/')[1]}.mcpir"
            write_mcpir(m, path)
            so = quiet_options()
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")   # the profile's reason
            runs[key] = MCPIRModel(path, options=so).run
        base, cand = Candidate("onnxruntime", "f32"), Candidate("onnxruntime", "int8")
        prof = Profile({}, [base, cand])
        _time([base, cand], runs, samples, prof, start, seconds, clock)
    choice.rounds, choice.seconds = prof.rounds, round(clock() - start, 3)
    choice.float_ms, choice.int8_ms = base.latency_ms, cand.latency_ms
    choice.ratio, choice.ratio_spread = cand.ratio, cand.ratio_spread
    choice.notes += prof.notes


def faster(choice: Int8Choice) -> bool:
    """int8 beats float beyond the spread of the paired runs (90th percentile of the ratios < 1)."""
    if choice.ratio_spread is None or choice.ratio_spread[1] >= 1.0:
        spread = (f" (paired ratios {choice.ratio_spread[0]:.2f}-{choice.ratio_spread[1]:.2f}, median "
                  f"{choice.ratio:.2f}, over {choice.rounds} rounds)") if choice.ratio_spread else ""
        choice.dropped = f"not faster than float beyond the spread of the paired runs{spread}"
        return False
    return True


def failed(choice: Int8Choice, e: BaseException) -> Int8Choice:
    choice.dropped = f"int8 quantization refused: {one_line(str(e), 300) or type(e).__name__}"
    return choice
