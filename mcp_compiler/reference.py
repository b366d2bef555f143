"""The reference: the original model run by onnxruntime (or onnx.reference), inputs it accepts,
and the comparison of another runtime's outputs with it. Targets verify their artifacts with it."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import UsageError, VerificationError


@dataclass
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    cosine: float
    ok: bool
    exercised: bool = True      # False: within atol of zero, or constant, on every sample
    nonfinite: bool = False     # the original gave only NaN/Inf here on every sample
    shape: str = ""             # where the entry's shape is not the original's: both, said (not "max abs inf")
    rel_error: float = 0.0      # the worst sample's ||b - a|| / ||a|| (what a budget's rel bounds)
    slice_rel_error: float | None = None   # under a budget: the worst slice's (accuracy.worst_slice)
    worst_slice: str | None = None
    exact_match: float | None = None    # under a budget, an integer or boolean output: the share equal


@dataclass
class VerifyReport:
    repository: str
    backend: str
    samples: int
    dims: dict[str, int]
    rtol: float
    atol: float
    outputs: list[OutputCheck] = field(default_factory=list)
    quantization_level: str = "none"
    reference: str = "onnxruntime"     # what ran the original
    layouts: dict[str, str] = field(default_factory=dict)   # interface values not in the original's layout
    inputs: dict = field(default_factory=dict)     # how the inputs were made (sizes, domains) or loaded
    budget: dict[str, float] = field(default_factory=dict)   # a quantized model: judged by this, not atol/rtol
    pinned_random: int = 0     # random nodes seeded alike in both models for the check (noise.py)
    sequence: dict = field(default_factory=dict)   # a stateful entry: the multi-step check's steps and state
    # a quantized original (QDQ, integer ops): the check is against onnxruntime at its default
    # optimization (int8 kernels, as a user runs it); the outputs against its basic level too
    # (constant folding dequantizes QDQ weights: what an entry that dequantizes at load computes).
    # Reported, not judged.
    at_basic_level: list[dict] = field(default_factory=list)
    execution: str = "onnxruntime/f32"   # what ran the entry (the execution it is served with)
    # the budget judges another engine or precision computing the same model (not a quantization,
    # nor one the user gave): a sample within atol everywhere is equal whatever its cosine
    atol_equal: bool = False
    warnings: list[str] = field(default_factory=list)   # what the check found besides the values
    # outputs where onnxruntime's own optimization levels disagree on the original, and the
    # level(s) the entry's outputs equal (reference._against_other_levels)
    reference_spread: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    def raise_if_failed(self) -> None:
        nan = [o for o in self.outputs if o.nonfinite]
        if nan:
            raise VerificationError(
                f"{self.repository}: the original model itself gives only NaN/Inf for output "
                f"{nan[0].name!r} on every sample; nothing can be compared: give inputs it accepts "
                "with --inputs")
        bad = [o for o in self.outputs if not o.ok]
        wrong = [o for o in bad if o.shape]
        if wrong:
            raise VerificationError(
                f"{self.repository}: output {wrong[0].name!r} has shape {wrong[0].shape}: not the entry of this "
                "model? (verify ORIGINAL.onnx DIR/NAME compares an entry with the model it was converted from)")
        if bad and self.budget:
            missed = [(o, m) for o in bad for m in [_missed(self.budget, o)] if m]
            o, what = missed[0] if missed else (min(bad, key=lambda x: x.cosine), "")
            raise VerificationError(
                f"{self.repository}: output {o.name!r} is outside the accuracy budget "
                f"{', '.join(f'{k}={v:g}' for k, v in self.budget.items())} of the "
                f"{self.quantization_level if self.quantization_level not in ('', 'none') else self.execution} model: "
                + (f"{what} (the worst of {self.samples} samples; " if what else f"over {self.samples} samples (")
                + f"cosine {o.cosine:.6f}, max abs {o.max_abs:.3g}, rel {o.rel_error:.3g}; "
                "--accuracy-budget sets the budget)")
        if bad:
            o = max(bad, key=lambda x: x.max_abs)
            raise VerificationError(
                f"{self.repository}: output {o.name!r} differs from onnxruntime on the original: "
                f"max abs {o.max_abs:.3g}, cosine {o.cosine:.6f} (atol {self.atol}, rtol {self.rtol})"
                + (f"; the model is quantized ({self.quantization_level}): --accuracy-budget judges it"
                   if self.quantization_level not in ("", "none") else ""))


def _missed(budget: dict[str, float], o: OutputCheck) -> str:
    """The budget's criteria an output's worst values fail, each with its value and bound."""
    from .accuracy import MATCH_DEFAULT, _slice_says, slice_bound

    if o.exact_match is not None:
        bound = budget.get("match", MATCH_DEFAULT)
        return f"{o.exact_match:.4f} of its elements equal the original's < match={bound:g}" \
            if o.exact_match < bound else ""
    out = []
    if o.cosine < budget.get("cos", -1.0):
        out.append(f"cosine {o.cosine:.6f} < cos={budget['cos']:g}")
    bound = slice_bound(budget)
    if o.slice_rel_error is not None and bound is not None and o.slice_rel_error > bound:
        out.append(f"relative error {o.slice_rel_error:.3g} of its slice at {o.worst_slice} > {_slice_says(budget, bound)}")
    if o.max_abs > budget.get("max-abs", float("inf")):
        out.append(f"max abs {o.max_abs:.3g} > max-abs={budget['max-abs']:g}")
    if o.rel_error > budget.get("rel", float("inf")):
        out.append(f"relative error {o.rel_error:.3g} > rel={budget['rel']:g}")
    return "; ".join(out)


def check_dims(model, dims: dict[str, int], flag: str = "--dims") -> None:  # noqa: ANN001
    """A size for a symbol the model does not have is a typo that would check the wrong size
    (inputs.plan raises it, listing the model's symbols)."""
    from .inputs import plan

    if dims:
        plan(model, dims, fold=False, flag=flag)   # the model itself is left as it is


def sample_inputs(model, dims: dict[str, int], samples: int, seed: int = 0,  # noqa: ANN001
                  run=None, fold: bool = True) -> tuple[list[dict], dict]:  # noqa: ANN001
    """`samples` input sets the model accepts (mcp_compiler.inputs), probed on `run` (the
    original) when given; and the plan as a dict for reports. `fold` folds the model's constant
    subgraphs in place first (for a model loaded only to make inputs)."""
    from .inputs import make, plan, probe

    p = plan(model, dims, fold=fold)
    if run is not None:
        probe(model, p, run, rng_seed=seed)
    rng = np.random.default_rng(seed)
    return [make(model, p, rng) for _ in range(samples)], p.to_dict()


def session_options(optimize: str = "default"):  # noqa: ANN201
    """The checks' session options: quiet, no packed weight copies, onnxruntime's default
    optimization (every fusion, int8 kernels), or with "basic" its basic level (constant folding
    dequantizes quantized weights, as an entry that dequantizes at load serves them), or with
    "disabled" none."""
    import onnxruntime as ort

    from .session import quiet_options

    so = quiet_options(prepack=False)
    level = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
             "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}.get(optimize)
    if level is not None:
        so.graph_optimization_level = level
    return so


def open_original(input: str | os.PathLike, optimize: str = "default"):  # noqa: ANN201
    """A session of the original: onnxruntime, or onnx.reference where onnxruntime has no kernel
    for one of its ops; and which one it is."""
    import onnxruntime as ort

    try:
        return (ort.InferenceSession(str(input), session_options(optimize), providers=["CPUExecutionProvider"]),
                "onnxruntime")
    except Exception as e:  # noqa: BLE001 - no kernel for an op the conversion legalized
        if "NOT_IMPLEMENTED" not in str(e):
            raise UsageError(f"onnxruntime cannot load the original {input}: {str(e).splitlines()[0]}") from None
        from onnx.reference import ReferenceEvaluator

        return (_Reference(ReferenceEvaluator(str(input))),
                "onnx.reference (onnxruntime has no kernel for an op of the original)")


def run_original(original, feeds: list[dict]) -> tuple[list[str], list[list]]:  # noqa: ANN001
    """The original's output names and its outputs on every sample."""
    wants = []
    for sample in feeds:
        try:
            wants.append(original.run(None, sample))
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"the original model fails on the inputs "
                             f"({ {k: list(v.shape) for k, v in sample.items()} }): "
                             f"{str(e).splitlines()[0]}; give symbol sizes with --dims or inputs with --inputs") from None
    return [o.name for o in original.get_outputs()], wants


class _Reference:
    """onnx.reference.ReferenceEvaluator with onnxruntime's run/get_outputs surface."""

    def __init__(self, ev) -> None:  # noqa: ANN001
        self.ev = ev

    def run(self, names, feeds):  # noqa: ANN001, ANN202
        return self.ev.run(names, feeds)

    def get_outputs(self):  # noqa: ANN202
        from types import SimpleNamespace

        return [SimpleNamespace(name=n) for n in self.ev.output_names]


def compare(a: np.ndarray, b: np.ndarray, rtol: float,
            atol: float) -> tuple[float, float, float, bool, bool, bool, float]:
    """(max abs, max rel, cosine, ok, exercised, original non-finite everywhere, relative error
    ||b - a|| / ||a||: what a budget's `rel` bounds, as the accuracy report's rel_error). Non-finite
    values must sit at the same positions in both (then they are left out of the numbers); an
    output entirely within atol of zero, or constant, is not exercised by the sample."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("inf"), float("inf"), 0.0, False, True, False, float("inf")
    if a.dtype.kind in "OSU" or a.dtype == bool:
        same = bool(np.array_equal(a, b))
        return (0.0 if same else 1.0), (0.0 if same else 1.0), (1.0 if same else 0.0), same, True, False, \
            (0.0 if same else 1.0)
    fa, fb = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    fin_a, fin_b = np.isfinite(fa), np.isfinite(fb)
    same_nonfinite = bool(np.array_equal(fin_a, fin_b) and np.array_equal(fa[~fin_a], fb[~fin_b], equal_nan=True))
    all_nonfinite = bool(fa.size and not fin_a.any())
    fa, fb = fa[fin_a & fin_b], fb[fin_a & fin_b]
    diff = np.abs(fa - fb)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(fa), 1e-12)).max()) if diff.size else 0.0
    na, nb = np.linalg.norm(fa), np.linalg.norm(fb)
    cos = float(fa @ fb / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    ok = same_nonfinite and not all_nonfinite and bool(np.allclose(fb, fa, rtol=rtol, atol=atol))
    rel_l2 = float(np.linalg.norm(fa - fb) / na) if na > 0 else (0.0 if nb == 0 else float("inf"))
    if not same_nonfinite:
        max_abs = max_rel = rel_l2 = float("inf")
    from .inputs import exercised

    return max_abs, max_rel, cos, ok, exercised(fa, atol), all_nonfinite, rel_l2


def compare_with_original(input: str | os.PathLike, emitted, report: VerifyReport, *,  # noqa: ANN001
                          seed: int = 0, inputs: str | os.PathLike | None = None) -> VerifyReport:
    """Fill `report` with the comparison of `emitted()` (a function returning a feeds -> outputs
    runner, called once the original is released) against the original on the user's inputs or
    on inputs the model accepts; values the report's layouts mark NHWC are transposed."""
    import gc
    from functools import partial

    from .frontend import load_onnx
    from .noise import pinned_onnx_session, random_nodes

    model = load_onnx(input, check=False, infer_shapes=False).model
    stochastic = bool(random_nodes(model))
    # One model in memory at a time (the original's outputs are kept, not its session), and no
    # prepacked weight copies: checking a 2 GB model costs about 2 GB, not 4 or 8.
    quantized = is_quantized(model)
    # judged against the original as a user runs it (default optimization: int8 kernels where it
    # has them); a quantized one's basic level (QDQ weights dequantized by constant folding;
    # integer ops such as MatMulInteger keep their int8 kernels there) is reported beside it
    original, report.reference = open_original(input, optimize="default")
    if inputs is not None:
        from .inputs import load_inputs

        if report.dims:
            raise UsageError("--dims sizes generated inputs; with --inputs the arrays give the sizes")
        feeds = load_inputs(inputs, model)
        report.inputs = {"from": str(inputs), "samples": len(feeds)}
    else:
        feeds, report.inputs = sample_inputs(model, report.dims, report.samples, seed, run=partial(original.run, None))
    report.samples = len(feeds)
    pinned = None
    if stochastic:
        # a stochastic model: the same noise in both, for the check only (the served one keeps it);
        # a fresh session, so that its generators start where the emitted model's will
        pinned, report.pinned_random = pinned_onnx_session(input, session_options())
    names, wants = run_original(pinned or original, feeds)
    quantized = quantized and report.reference == "onnxruntime"
    model = original = pinned = None   # released before the emitted model is loaded
    gc.collect()
    basic_wants = None
    if quantized:   # one session at a time: the basic-level one after the default one is gone
        sess = open_original(input, optimize="basic")[0]
        basic_wants = run_original(sess, feeds)[1]
        sess = None
        gc.collect()
        report.reference = "onnxruntime (default optimization, as a user runs the original: its int8 kernels)"
    run = emitted(pin=True) if report.pinned_random else emitted()
    got = _compare_all(report, run, feeds, names, wants)
    run = None
    if not report.ok and not report.pinned_random and report.reference.startswith("onnxruntime"):
        _against_other_levels(input, report, feeds, names, got,
                              {"default": wants, **({"basic": basic_wants} if quantized else {})})
    if basic_wants is not None:
        for i, name in enumerate(names):
            rows = [compare(w[i], g[i], report.rtol, report.atol) for w, g in zip(basic_wants, got)]
            report.at_basic_level.append({"name": name, "max_abs": max(r[0] for r in rows),
                                          "max_rel": max(r[1] for r in rows), "cosine": min(r[2] for r in rows)})
    return report


QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
                 "MatMulInteger", "DynamicQuantizeLinear", "MatMulNBits", "QLinearAdd", "QLinearMul",
                 "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm"}


def is_quantized(model) -> bool:  # noqa: ANN001 - an IR Model
    """The model holds quantized arithmetic (QDQ pairs, integer or n-bit kernels): onnxruntime's
    default optimization then runs int8 kernels where its basic level computes in float."""
    return any(n.op_type in QUANTIZED_OPS for n in model.graph.walk())


def _compare_all(report: VerifyReport, run, feeds: list[dict], names: list[str], wants: list) -> list[list]:  # noqa: ANN001
    """Fill report.outputs; returns the emitted outputs (in the original's layout), per sample."""
    nhwc = {k for k, v in report.layouts.items() if v == "NHWC"}
    stats: dict[str, list] = {}
    shapes: dict[str, str] = {}
    outs = []
    for sample, want in zip(feeds, wants):
        got = run({k: np.ascontiguousarray(v.transpose(0, 2, 3, 1)) if k in nhwc else v for k, v in sample.items()})
        got = [np.asarray(b).transpose(0, 3, 1, 2) if name in nhwc else b for name, b in zip(names, got)]
        outs.append(got)
        for name, a, b in zip(names, want, got):
            stats.setdefault(name, []).append(compare(a, b, report.rtol, report.atol))
            if np.shape(a) != np.shape(b) and name not in shapes:
                shapes[name] = f"{list(np.shape(b))} where the original's is {list(np.shape(a))}"
    for k, (name, rows) in enumerate(stats.items()):
        # a quantized model or another precision: the budget, not float32 tolerances (worst sample)
        ok = all(_row_ok(report, r) for r in rows)
        check = OutputCheck(
            name, max(r[0] for r in rows), max(r[1] for r in rows), min(r[2] for r in rows),
            ok, exercised=any(r[4] for r in rows), nonfinite=all(r[5] for r in rows), shape=shapes.get(name, ""),
            rel_error=max(r[6] for r in rows))
        if report.budget and not check.shape:
            _judge_parts(report, check, [w[k] for w in wants], [g[k] for g in outs])
        report.outputs.append(check)
    return outs


def _judge_parts(report: VerifyReport, check: OutputCheck, want: list, got: list) -> None:
    """Under a budget: an integer or boolean output by the share of equal elements (not by cosine,
    which passed ids of which 12% had changed); a float one's worst slice by `cos` as well as the
    whole (a detector's scores beside its boxes)."""
    from .accuracy import MATCH_DEFAULT, exact_match, slice_bound, worst_slice

    kind = np.asarray(want[0]).dtype.kind
    if kind in "iub":
        check.exact_match = exact_match(want, got)
        check.ok = check.exact_match >= report.budget.get("match", MATCH_DEFAULT)
    elif kind == "f" and not (report.atol_equal and check.max_abs <= report.atol):
        sl, bound = worst_slice(want, got), slice_bound(report.budget)
        if sl is not None:
            check.slice_rel_error, check.worst_slice = sl
            check.ok = check.ok and (bound is None or sl[0] <= bound)


def _row_ok(report: VerifyReport, r: tuple) -> bool:
    """One sample's comparison (compare's tuple) meets the report's tolerances or budget. Another
    engine's sample within atol everywhere is equal whatever its cosine (a detector's map of 1e-7
    probabilities at a small size: cosine 0.53 at differences of 9e-8); a quantization's is judged
    by its budget (a small output's 1e-5 is 1%)."""
    if not report.budget:
        return r[3]
    return r[0] != float("inf") and ((report.atol_equal and r[0] <= report.atol) or _within(report.budget, r))


def _against_other_levels(input, report: VerifyReport, feeds: list[dict], names: list[str],  # noqa: ANN001
                          got: list[list], runs: dict[str, list]) -> None:
    """An output that failed against the original may sit on a knife-edge of the original itself:
    a float rounded to an index (T5's relative-position buckets: log(n / 8) / log(16) * 8 is 2 or
    1.9999999 as onnxruntime fuses a Div and a Mul or not), after which dynamic int8 quantization
    amplifies one ulp into another logit. Then onnxruntime's own optimization levels disagree on
    the original, and no one answer is "the original's". The original is run at onnxruntime's
    other levels (one session at a time); an output passes only if, on every sample, it meets the
    check as it was, or against one of them where those runs disagree with each other; the report
    says so (`reference_spread`, a warning), with how far apart onnxruntime's own runs were."""
    import gc

    for level in ("disabled", "basic", "default"):
        if level not in runs:
            sess = open_original(input, optimize=level)[0]
            runs[level] = run_original(sess, feeds)[1]
            sess = None
            gc.collect()
    first = next(iter(runs))
    for k, o in enumerate(report.outputs):
        if o.ok or o.nonfinite:
            continue
        i = names.index(o.name)
        rows, matched, spread = [], set(), []
        for s, g in enumerate(got):
            tried = {level: compare(w[s][i], g[i], report.rtol, report.atol) for level, w in runs.items()}
            if _row_ok(report, tried[first]):
                rows.append(tried[first])   # this sample met the check as it was
                continue
            passing = [level for level, r in tried.items() if _row_ok(report, r)]
            if not passing:
                break
            apart = [compare(runs[first][s][i], w[s][i], report.rtol, report.atol) for w in runs.values()]
            if all(a[3] for a in apart):
                break   # onnxruntime agrees with itself here: the failure is the entry's
            matched.add(passing[0])
            rows.append(tried[passing[0]])
            spread.append((max(a[0] for a in apart), min(a[2] for a in apart)))
        else:
            if not spread:   # every sample met the check as it was: what failed is the whole's (slices, match)
                continue
            report.outputs[k] = OutputCheck(o.name, max(r[0] for r in rows), max(r[1] for r in rows),
                                            min(r[2] for r in rows), True, exercised=o.exercised,
                                            rel_error=max(r[6] for r in rows))
            far, cos = max(a for a, _ in spread), min(c for _, c in spread)
            report.reference_spread.append({"name": o.name, "levels": sorted(matched), "max_abs": far, "cosine": cos})
            report.warnings.append(
                f"output {o.name!r}: onnxruntime's own optimization levels disagree on the original "
                f"(max abs {far:.3g}, cosine {cos:.6f} between them on these samples: a value on a "
                "knife-edge, such as a float rounded to an index); the entry's outputs equal onnxruntime's at "
                f"its {' or '.join(sorted(matched))} level, on every sample")


def _within(budget: dict[str, float], row: tuple) -> bool:
    """One sample's (max abs, max rel, cosine, ..., relative error) within an --accuracy-budget:
    cos, max-abs, and rel (the relative error ||b - a|| / ||a||, as the accuracy report reads it)."""
    max_abs, cos, rel = row[0], row[2], row[6]
    return (cos >= budget.get("cos", -1.0) and max_abs <= budget.get("max-abs", float("inf"))
            and rel <= budget.get("rel", float("inf")))


def verify_onnx(input: str | os.PathLike, emitted: str | os.PathLike, *, samples: int | None = None,
                dims: dict[str, int] | None = None, rtol: float = 1e-3, atol: float = 1e-4,
                seed: int = 0, inputs: str | os.PathLike | None = None,
                budget: dict[str, float] | None = None) -> VerifyReport:
    """The emitted ONNX file against the original, both run by onnxruntime (a quantized one judged
    by `budget` on 16 samples)."""
    from .accuracy import SAMPLES
    from .files import check_regular_input

    check_regular_input(input)

    def runner(pin: bool = False):  # noqa: ANN202
        import onnxruntime as ort

        from .noise import pinned_onnx_session

        sess = pinned_onnx_session(emitted, session_options())[0] if pin else None
        sess = sess or ort.InferenceSession(str(emitted), session_options(), providers=["CPUExecutionProvider"])
        return lambda feeds: sess.run(None, feeds)

    report = VerifyReport(str(emitted), "onnxruntime", samples or (SAMPLES if budget else 1), dict(dims or {}), rtol, atol)
    report.budget = dict(budget or {})
    return compare_with_original(input, runner, report, seed=seed, inputs=inputs)
