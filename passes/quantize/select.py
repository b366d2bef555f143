"""Which layers to keep in float so that an accuracy budget holds (--accuracy-budget, --auto-exclude).

The quantize passes compute every candidate's quantized weight first; before rewriting any,
they hand each one here as its float stand-in (the dequantized values, in the weight's own
layout). One onnxruntime session of the float model takes those weights as feeds (they
become overridable initializers), so each trial is a run, not a rebuild:

1. everything quantized: within the budget -> nothing kept;
2. one layer at a time: its sensitivity (the worst 1 - cosine over the outputs);
3. the most sensitive layers kept first: the fewest that bring the budget back, by bisection
   over that order (each step checked on the samples).

The result is then measured for real, on the rewritten model against the original (compile's
accuracy report): quantized kernels can differ from the stand-in by their own rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mcp_compiler.ir import DataType, Model, TensorType, Value


@dataclass
class Layer:
    weight: Value             # the float weight the layer's quantized one replaces
    stand_in: np.ndarray      # the dequantized weight, same shape and dtype as weight.const
    bytes_saved: int          # what quantizing it saves


@dataclass
class Selection:
    kept: list[str] = field(default_factory=list)          # weight names kept in float, most sensitive first
    sensitivity: dict[str, float] = field(default_factory=dict)   # weight -> 1 - closeness with it alone quantized
    all_quantized: float = 0.0                              # worst 1 - cosine with every layer quantized
    reached: float = 0.0                                    # worst 1 - cosine with `kept` in float
    holds: bool = True
    runs: int = 0


def select(model: Model, layers: list[Layer], samples: list[dict], budget: dict[str, float]) -> Selection:
    """The layers to keep in float (see the module docstring)."""
    from mcp_compiler.accuracy import AccuracyReport, _compare, check_budget, closeness, comparable
    from mcp_compiler.errors import AccuracyError

    sel = Selection()
    if not layers or not samples:
        return sel
    run = _Runner(model, [lay.weight for lay in layers], samples)
    reference = run({})

    def measure(quantized: list[Layer]) -> tuple[bool, float]:
        got = run({lay.weight.name: lay.stand_in for lay in quantized})
        sel.runs += 1
        report = AccuracyReport("selection", len(samples))
        for i, name in enumerate(run.names):
            want = [r[i] for r in reference]
            if all(comparable(w) for w in want):
                report.outputs.append(_compare(name, want, [g[i] for g in got]))
        worst = max((1.0 - closeness(o) for o in report.outputs), default=0.0)
        try:
            check_budget(report, budget)
        except AccuracyError:
            return False, worst
        return True, worst

    ok, sel.all_quantized = measure(layers)
    sel.reached = sel.all_quantized
    if ok:
        return sel
    for lay in layers:
        sel.sensitivity[lay.weight.name] = measure([lay])[1]
    order = sorted(layers, key=lambda lay: -sel.sensitivity[lay.weight.name])
    lo, hi = 0, len(order)          # keeping order[:hi] holds (all kept = the float model)
    best_worst = 0.0
    while lo < hi:
        mid = (lo + hi) // 2
        ok, worst = measure(order[mid:])
        if ok:
            hi, best_worst = mid, worst
        else:
            lo = mid + 1
    if hi == len(order):   # not even the least sensitive layer alone: nothing to quantize
        sel.holds = False
        sel.reached = min(sel.sensitivity.values())
        return sel
    sel.kept = [lay.weight.name for lay in order[:hi]]
    sel.reached = best_worst
    return sel


class _Runner:
    """One session of `model` with `weights` as feeds that replace their initializers."""

    def __init__(self, model: Model, weights: list[Value], samples: list[dict]) -> None:
        from mcp_compiler.session import create_session

        g = model.graph
        saved = list(g.inputs)
        extra = [w for w in {id(w): w for w in weights}.values() if w not in saved]
        for w in extra:
            if not isinstance(w.type, TensorType):
                w.type = TensorType(DataType(w.const.dtype), tuple(w.const.dims))
        g.inputs = saved + extra
        try:
            self.sess = create_session(model)
        finally:
            g.inputs = saved
        self.names = [o.name for o in self.sess.get_outputs()]
        self.samples = samples

    def __call__(self, weights: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
        return [self.sess.run(None, {**feeds, **weights}) for feeds in self.samples]



def keep_for_budget(model: Model, ctx, layers: Callable[[], list[Layer]]) -> tuple[set[str], dict | None]:  # noqa: ANN001
    """With a budget to hold (ctx.budget and ctx.samples): the weight names to keep in float
    and the selection's summary for the report. `layers` makes the stand-ins (only then)."""
    if not ctx.budget or not ctx.samples:
        return set(), None
    layers = list({lay.weight.name: lay for lay in layers()}.values())
    if not layers:
        return set(), None
    sel = select(model, layers, ctx.samples, ctx.budget)
    if not sel.holds:
        from mcp_compiler.errors import AccuracyError

        least = min(sel.sensitivity, key=sel.sensitivity.get)
        raise AccuracyError(f"no selection of quantized layers holds --accuracy-budget "
                            f"{','.join(f'{k}={v}' for k, v in ctx.budget.items())}: every layer quantized "
                            f"reaches 1 - cosine {sel.all_quantized:.3g}, the least sensitive alone ({least}) "
                            f"{sel.sensitivity[least]:.3g}; nothing was written")
    kept = set(sel.kept)
    summary = {"layers": len(layers), "kept": sel.kept, "runs": sel.runs, "holds": sel.holds,
               "worst_1_minus_cos_all_quantized": round(sel.all_quantized, 8),
               "worst_1_minus_cos_selected": round(sel.reached, 8),
               "bytes_kept_in_float": sum(lay.bytes_saved for lay in layers if lay.weight.name in kept),
               "sensitivity": {k: round(v, 8) for k, v in sorted(sel.sensitivity.items(), key=lambda kv: -kv[1])}}
    return kept, summary
