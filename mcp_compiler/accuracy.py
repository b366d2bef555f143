"""Accuracy of a quantized model against onnxruntime on the original, and budgets on it."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import AccuracyError, UsageError
from .ir import DataType, Model, TensorType

# --accuracy-budget keys: (report field, "min" = the value must be at least the bound)
# ("slice" bounds the worst slice's relative error, by default SLICE_FACTOR x what cos or rel
# allow the whole; "match" judges integer and boolean outputs: ids,
# argmax, masks, the share of elements equal to the original's)
BUDGET_KEYS = {"cos": ("cosine", "min"), "max-abs": ("max_abs", "max"), "rel": ("rel_error", "max"),
               "top1": ("top1_agreement", "min"), "match": ("exact_match", "min"),
               "slice": ("slice_rel_error", "max")}
# An axis is sliced when it has 2 to SLICE_MAX entries: the axis that names features (a
# detector's 4 box rows beside its 1 to 80 class-score rows) or positions of a short sequence;
# a longer one (1,000 classes, 8,400 anchors, a 256-wide hidden state) is the population a slice
# is judged over.
SLICE_MAX = 128
# ... and only where each of its slices holds at least SLICE_MIN_VALUES values of one sample (a
# part of the output with a population of its own: 2,100 anchors of one score row, one position's
# 6,625 class scores). A classifier's [1, 2] probabilities are not sliced into single numbers:
# a 0.001 probability off by 0.001 is not a destroyed slice (top-1 and the whole judge it).
SLICE_MIN_VALUES = 16
# A slice is judged by its relative error ||b - a|| / ||a||, on its own scale: a detector's
# class scores of 0 to 1 beside its box coordinates of 0 to 320 in one output (YOLOv8's output0;
# int8 with one scale over both rounded every score to 0 or 1.24 while the whole output's cosine
# read 0.9997). Only a slice the original barely uses (under SLICE_UNUSED of the axis's median
# slice: a channel a ReLU keeps at zero) is measured against that floor instead. The bound is
# SLICE_FACTOR times the relative error `cos` allows the whole (sqrt(2 (1 - cos)), or `rel`
# where given): the worst of many slices is a maximum, noisier than the whole; a destroyed
# slice's relative error is near 1 or above.
SLICE_UNUSED = 1e-3
SLICE_FACTOR = 3.0
# What an integer or boolean output (ids, argmax, masks) is judged by under a budget that names no
# `match`: it is never unjudged (an INT4 entry whose only output was ids passed with 12% of them
# changed when only float outputs were judged)
MATCH_DEFAULT = 0.99


# What a quantized model is judged by when no --accuracy-budget is given: verify and --verify use
# it instead of float32 tolerances, and convert warns when its accuracy report falls under it.
# A float precision change is judged by the direction of each output (cosine) and by its size
# (rel: ||quantized - reference|| / ||reference||): cosine alone passed a detector whose box
# offsets were off by 26 pixels in fp16.
# (Integer outputs are judged by MATCH_DEFAULT under every budget that names no `match`.)
DEFAULT_BUDGETS = {"fp16": {"cos": 0.999, "rel": 0.02}, "bf16": {"cos": 0.999, "rel": 0.05},
                   "fp8": {"cos": 0.99}, "int4": {"cos": 0.98}, "int8": {"cos": 0.99}}
SAMPLES = 16   # the accuracy report's random samples (a budget met on 2 was missed on others)
# The seed of the samples a budget is judged on (verify): the accuracy report and the layer
# selection draw theirs from seed 0, so the judge never sees a sample that chose.
JUDGE_SEED = 1009


def default_budget(level: str | None) -> dict[str, float]:
    """The budget a model quantized at `level` is judged by (empty: not quantized)."""
    return dict(DEFAULT_BUDGETS.get(level or "none", {}))


@dataclass
class OutputAccuracy:
    name: str
    max_abs: float
    rel_error: float          # ||quantized - reference|| / ||reference|| over all samples
    cosine: float             # the worst sample's (what a budget is checked against)
    top1_agreement: float | None = None   # share of rows with the same argmax on the last axis
    cosine_all: float | None = None       # over all elements of all samples together
    slice_rel_error: float | None = None  # the worst slice's relative error (slice_bound judges it)
    worst_slice: str | None = None        # which: "axis 1 index 4"
    exact_match: float | None = None      # an integer or boolean output: the share of equal elements


@dataclass
class AccuracyReport:
    inputs: str               # "random (N samples)" or "DIR (N samples)"
    samples: int
    outputs: list[OutputAccuracy] = field(default_factory=list)
    budget: dict[str, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    pinned_random: int = 0    # random nodes seeded alike in both models for the measurement

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


# the values each budget key takes (a NaN fails every comparison, and so is refused too)
BUDGET_RANGES = {"cos": (0.0, 1.0), "top1": (0.0, 1.0), "max-abs": (0.0, 1e30), "rel": (0.0, 1e30),
                 "match": (0.0, 1.0), "slice": (0.0, 1e30)}


def parse_budget(text: str | None) -> dict[str, float]:
    """`cos=0.99,max-abs=0.5` -> {"cos": 0.99, "max-abs": 0.5}."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in BUDGET_KEYS:
            raise UsageError(f"--accuracy-budget: expected KEY=VALUE with KEY one of "
                             f"{', '.join(BUDGET_KEYS)}, got {part!r}")
        value = value.strip()
        try:
            if not value.isascii():   # float() takes Arabic-Indic and other digits
                raise ValueError
            v = float(value)
        except ValueError:
            raise UsageError(f"--accuracy-budget {key}: {value!r} is not a number") from None
        lo, hi = BUDGET_RANGES[key]
        if not lo <= v <= hi:
            raise UsageError(f"--accuracy-budget {key}={value}: must be between {lo:g} and {hi:g}")
        out[key] = v
    return out


def load_samples(folder: str | os.PathLike, model: Model) -> list[dict[str, np.ndarray]]:
    """Every *.npz in `folder` (sorted by name): one input sample each, keyed by input name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"--calibration-data {folder}: not a folder")
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise UsageError(f"--calibration-data {folder}: no .npz files")
    inputs = {v.name: v for v in model.graph.inputs if v.const is None}
    samples = []
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as z:
                sample = {k: z[k] for k in z.files}
        except Exception as e:  # noqa: BLE001 - zipfile/numpy raise many kinds on a bad file
            raise UsageError(f"--calibration-data {f}: not a readable .npz ({e})") from None
        missing = sorted(set(inputs) - set(sample))
        extra = sorted(set(sample) - set(inputs))
        if missing or extra:
            raise UsageError(f"--calibration-data {f}: " + "; ".join(
                ([f"missing input {', '.join(missing)}"] if missing else [])
                + ([f"no model input named {', '.join(extra)}"] if extra else [])))
        for name, arr in sample.items():
            t = inputs[name].type
            if isinstance(t, TensorType) and arr.dtype != DataType(t.elem_type).numpy_dtype:
                raise UsageError(f"--calibration-data {f}: input {name} is {arr.dtype}, the model "
                                 f"takes {DataType(t.elem_type).name.lower()}")
        samples.append(sample)
    return samples


def random_samples(reference, n: int, dims: dict[str, int], seed: int = 0) -> list[dict[str, np.ndarray]]:  # noqa: ANN001
    """`n` input sets the original accepts (mcp_compiler.inputs), probed on it: `reference` is the
    original ONNX's path, or an IR model (an .mcpir input)."""
    from .reference import sample_inputs

    if isinstance(reference, Model):
        from .session import create_session

        model, sess = reference, create_session(reference)
    else:
        from .frontend import load_onnx
        from .reference import open_original as _original

        model, sess = load_onnx(reference, check=False, infer_shapes=False).model, _original(reference)[0]
    # an IR reference is measured afterwards: it is planned on as it is, not folded
    samples, _ = sample_inputs(model, dims, n, seed, run=lambda f: sess.run(None, f),
                               fold=not isinstance(reference, Model))
    return samples


def measure(reference, model: Model, samples: list[dict[str, np.ndarray]], label: str) -> AccuracyReport:  # noqa: ANN001
    """Run `reference` (a path to the original ONNX, or an IR Model) and `model` on each sample."""
    import onnxruntime as ort

    from .noise import pin_ir, pinned_onnx_session, unpin_ir
    from .reference import run_original
    from .session import create_session, quiet_options

    so = quiet_options()
    # a stochastic model: the same noise in both for the measurement (the model is put back after)
    undo = pin_ir(model)
    try:
        if isinstance(reference, Model):
            ref_undo = pin_ir(reference) if undo else []
            ref = create_session(reference, so)
            unpin_ir(ref_undo)
        else:
            ref = (pinned_onnx_session(reference, so)[0] if undo else None) or \
                ort.InferenceSession(str(reference), so, providers=["CPUExecutionProvider"])
        quant = create_session(model, so)
    finally:
        unpin_ir(undo)
    names, want_all = run_original(ref, samples)
    got_all = [quant.run(names, feeds) for feeds in samples]
    report = AccuracyReport(label, len(samples), pinned_random=len(undo))
    for i, name in enumerate(names):
        a = [w[i] for w in want_all]
        b = [g[i] for g in got_all]
        if not all(comparable(x) for x in a):
            continue
        for k, (x, y) in enumerate(zip(a, b)):
            if np.shape(x) != np.shape(y):   # (an elementwise comparison cannot be made: said, not a crash)
                raise AccuracyError(
                    f"the quantized model's output {name!r} has shape {list(np.shape(y))} where the original's is "
                    f"{list(np.shape(x))} (sample {k + 1} of {label}): its length depends on the precision (e.g. the boxes "
                    "kept above a score threshold), so no budget can judge it; keep the layers that feed it in "
                    "float (--quantize-exclude) or the model at f32; nothing was written")
        report.outputs.append(_compare(name, a, b))
    if not report.outputs:
        raise AccuracyError(f"no output of the model can be judged on {label} (none is a number, an integer or a "
                            f"boolean: {', '.join(names)}): a budget that judged nothing is no pass; nothing was written")
    return report


def comparable(x) -> bool:  # noqa: ANN001
    """A float, integer or boolean array: what a budget judges (strings are not)."""
    return np.asarray(x).dtype.kind in "fiub"


def worst_slice(want: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, str] | None:
    """The largest relative error of one slice of a float output over the samples together
    (SLICE_UNUSED's comment), and which slice: every index of
    every axis with 2 to SLICE_MAX entries, of outputs of rank >= 2, so that a small slice beside
    a large one (a detector's class scores of 0 to 1 beside its box coordinates of 0 to 320, in
    one output) is judged on its own. None: nothing to slice."""
    shapes = {np.shape(w) for w in want} | {np.shape(g) for g in got}
    if len(shapes) != 1:
        return None
    shape = shapes.pop()
    if len(shape) < 2:
        return None
    a = np.stack([np.asarray(w, np.float64) for w in want])
    b = np.stack([np.asarray(g, np.float64) for g in got])
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = np.where(ok, a, 0.0), np.where(ok, b, 0.0)
    worst: tuple[float, str] | None = None
    total = int(np.prod(shape))
    for axis, size in enumerate(shape):
        if not 2 <= size <= SLICE_MAX or total // size < SLICE_MIN_VALUES:
            continue
        ax = axis + 1   # past the samples' axis
        x = np.moveaxis(a, ax, 0).reshape(size, -1)
        y = np.moveaxis(b, ax, 0).reshape(size, -1)
        nx = np.linalg.norm(x, axis=1)
        floor = max(SLICE_UNUSED * float(np.median(nx)), 1e-30)
        rel = np.linalg.norm(x - y, axis=1) / np.maximum(nx, floor)
        k = int(np.argmax(rel))
        if worst is None or rel[k] > worst[0]:
            worst = (float(rel[k]), f"axis {axis} index {k}")
    return worst


def slice_bound(budget: dict[str, float]) -> float | None:
    """The largest relative error a slice may have under `budget` (None: unbounded)."""
    if "slice" in budget:
        return budget["slice"]
    bounds = []
    if "cos" in budget:
        bounds.append(float(np.sqrt(2.0 * max(0.0, 1.0 - budget["cos"]))))
    if "rel" in budget:
        bounds.append(budget["rel"])
    return SLICE_FACTOR * min(bounds) if bounds else None


def exact_match(want: list[np.ndarray], got: list[np.ndarray]) -> float:
    """The share of elements equal to the original's over the samples (a shape that differs: 0)."""
    same = total = 0
    for w, g in zip(want, got):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape:
            return 0.0
        same += int(np.count_nonzero(w == g))
        total += w.size
    return same / total if total else 1.0


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)


def _compare(name: str, want: list[np.ndarray], got: list[np.ndarray]) -> OutputAccuracy:
    integer = np.asarray(want[0]).dtype.kind != "f"
    fa = np.concatenate([np.asarray(x, np.float64).ravel() for x in want])
    fb = np.concatenate([np.asarray(x, np.float64).ravel() for x in got])
    d = fa - fb
    na = float(np.linalg.norm(fa))
    worst = min(cosine(np.asarray(w, np.float64).ravel(), np.asarray(g, np.float64).ravel()) for w, g in zip(want, got))
    rel = float(np.linalg.norm(d)) / na if na > 0 else (0.0 if not d.any() else float("inf"))
    top1 = None
    if want[0].ndim in (2, 3) and want[0].shape[-1] >= 2:
        same = [np.argmax(w, -1) == np.argmax(g, -1) for w, g in zip(want, got)]
        top1 = float(np.mean(np.concatenate([s.ravel() for s in same])))
    if integer:   # judged by exact match alone (the numbers are reported)
        return OutputAccuracy(name, float(np.abs(d).max(initial=0.0)), rel, worst, cosine_all=cosine(fa, fb),
                              exact_match=exact_match(want, got))
    sl = worst_slice(want, got)
    return OutputAccuracy(name, float(np.abs(d).max(initial=0.0)), rel, worst, top1, cosine(fa, fb),
                          *(sl if sl else (None, None)))


def closeness(o: OutputAccuracy) -> float:
    """One number for how close an output is, 1 = equal: an integer output's exact-match share,
    a float one's lowest cosine (the worst sample's, or its worst slice's)."""
    if o.exact_match is not None:
        return o.exact_match
    # a slice's relative error as the cosine that allows it (slice_bound, inverted)
    sl = 1.0 - (o.slice_rel_error / SLICE_FACTOR) ** 2 / 2.0 if o.slice_rel_error is not None else 1.0
    return min(o.cosine, sl)


def missed(o: OutputAccuracy, budget: dict[str, float]) -> list[str]:
    """Each criterion of `budget` output `o` fails, with its value and bound. An integer or
    boolean output is judged by `match` alone; a float one's `cos` bounds its worst slice too."""
    out = []
    if o.exact_match is not None and budget and "match" not in budget:
        budget = {**budget, "match": MATCH_DEFAULT}
    for key, bound in budget.items():
        fld, kind = BUDGET_KEYS[key]
        if (o.exact_match is not None) != (key == "match") or key == "slice":
            continue
        v = getattr(o, fld)
        if v is not None and ((kind == "min" and not v >= bound) or (kind == "max" and not v <= bound)):
            digits = max(6, _digits(bound))   # 0.99999999 is not "1": as many digits as the bound needs
            out.append(f"{fld.replace('_', ' ')} {v:.{digits}g} {'<' if kind == 'min' else '>'} {key}={bound:.{digits}g}")
    bound = slice_bound(budget)
    if o.slice_rel_error is not None and bound is not None and not o.slice_rel_error <= bound:
        out.append(f"relative error {o.slice_rel_error:.3g} of its slice at {o.worst_slice} > {_slice_says(budget, bound)}")
    return out


def _digits(v: float) -> int:
    """The significant digits that tell `v` apart from its neighbours (at most 12)."""
    return next((d for d in range(1, 13) if float(f"{v:.{d}g}") == v), 12)


def _slice_says(budget: dict[str, float], bound: float) -> str:
    return (f"slice={bound:g}" if "slice" in budget else
            f"{bound:.3g} (a slice's bound: {SLICE_FACTOR:g} x the whole's; slice=V sets it)")


def under_default(report: AccuracyReport, level: str) -> list[str]:
    """What falls under `level`'s default budget (a warning when no budget was given)."""
    return [f"output {o.name!r}: {m}, outside the default {level} budget on {report.inputs}; --accuracy-budget "
            "makes it an error, --quantize-exclude / --auto-exclude keep layers in float"
            for o in report.outputs for m in missed(o, default_budget(level))]


def check_budget(report: AccuracyReport, budget: dict[str, float]) -> None:
    """Fill report.violations; raise AccuracyError when there are any."""
    report.budget = dict(budget)
    report.violations += [f"output {o.name!r}: {m}" for o in report.outputs for m in missed(o, budget)]
    if report.violations:
        raise AccuracyError(f"quantized model outside --accuracy-budget on {report.inputs}: "
                            f"{report.violations[0]}"
                            + (f" (and {len(report.violations) - 1} more)" if len(report.violations) > 1 else "")
                            + "; nothing was written")
