"""INT8 static quantization (QDQ), calibrated on real samples, with the nodes whose int8 form
breaks the budget kept in float.

onnxruntime's own quantizer (`onnxruntime.quantization`, QDQ format) writes the model: per-channel
int8 weights, uint8 activations by default (VNNI's VPDPBUSD multiplies unsigned by signed bytes:
signed activations were no faster, or slower, on 3 of 4 real models here: `../notes` int8.md is
reproduced by benchmarks/bench_int8.py), QuantizeLinear/DequantizeLinear around every quantized
node, which onnxruntime's default optimization fuses into int8 kernels (QLinearConv, ...).

1. The calibration samples (--calibration-data) are split: even ones calibrate (activation
   ranges), odd ones select (the method and the nodes kept in float are judged on them only).
2. Calibration methods: minmax and percentile (99.999) both measured (`auto`), the one closer to
   the float model on the selection samples kept; `--calibration-method` fixes one (entropy too).
3. Mixed precision: the float model's nodes, in graph order, are cut into up to SEGMENTS runs of
   equally many compute nodes (Conv, MatMul, Gemm, ...). If everything quantized misses the
   budget, each run alone quantized gives its sensitivity, and the most sensitive runs are kept in
   float: the fewest that bring the budget back (bisection over that order), as the INT4/FP8
   layer selection does, then each kept run is tried back in int8 (kept only where the budget
   needs it); the selection holds a tighter budget than the judge (SELECT_MARGIN).
   A detector's head (its boxes and class scores in one output) is such a run. When not even
   the least sensitive run alone holds, int8 is refused (AccuracyError).

Every trial reuses one calibration (onnxruntime's calibration cache): a trial is a quantization
and a session, not a calibration.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mcp_compiler.errors import AccuracyError, UnsupportedError, UsageError
from mcp_compiler.ir import Model

from .._infra import Pass, PassContext, PassResult, Property
from .options import QuantizeOptions

MIN_OPSET = 13          # per-channel DequantizeLinear (axis)
SEGMENTS = 12           # runs of the graph the selection measures
COMPUTE_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
METHODS = ("minmax", "percentile", "entropy")
# The selection holds a tighter budget than the one that judges (half the cosine gap, 0.7x the
# errors): a choice made on 4 pictures met the budget there at a slice error of 0.31 and reached
# 0.445 (over its bound of 0.424) on 8 others; held-out samples need room.
SELECT_MARGIN = 0.7


def tightened(budget: dict[str, float]) -> dict[str, float]:
    """The budget the selection holds (SELECT_MARGIN)."""
    from mcp_compiler.accuracy import slice_bound

    out = {}
    for k, v in budget.items():
        out[k] = (1.0 - (1.0 - v) / 2.0 if k in ("cos", "top1", "match") else v * SELECT_MARGIN)
    bound = slice_bound(budget)
    if bound is not None:
        out["slice"] = bound * SELECT_MARGIN
    return out


@dataclass
class Trial:
    excluded: frozenset[int]       # segments kept in float
    closeness: float               # the worst output's (accuracy.closeness) on the selection samples
    holds: bool
    missed: list[str] = field(default_factory=list)


class QuantizeInt8Pass(Pass):
    """INT8 static QDQ: calibrated weights and activations, the nodes that break the budget kept in float."""

    name = "quantize-int8"
    requires = frozenset()
    establishes = frozenset()
    preserves = frozenset({Property.NO_CONSTANT_NODES})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opts = ctx.quantize or QuantizeOptions(mode="int8")
        samples = ctx.calibration
        if not samples:
            raise UsageError("--quantize int8 needs --calibration-data DIR (real input samples, one .npz each): "
                             "drawn inputs calibrate nothing real")
        if model.onnx_opset < MIN_OPSET:
            raise ValueError(f"int8 QDQ needs ai.onnx opset >= {MIN_OPSET}, the model imports {model.onnx_opset} "
                             "(run upgrade-opset first)")
        from mcp_compiler.accuracy import default_budget

        budget = dict(ctx.budget or default_budget("int8"))
        calib, select = (samples[0::2], samples[1::2]) if len(samples) >= 2 else (samples, samples)
        with tempfile.TemporaryDirectory(prefix="mcp-int8-") as tmp:
            q = _Quantizer(model, Path(tmp), calib, select, opts, budget)
            result = q.run(search=opts.search)
            _move_into(model, result.proto)
        if q.reduce_range:
            result.notes.append("int8 weights at 7 bits (reduce_range): this CPU has no VNNI, where onnxruntime's "
                                "uint8 x int8 kernels can saturate (its own advice); the entry then runs alike on one with it")
        stats = {"method": result.method, "activations": opts.int8_activations, "calibration_samples": len(calib),
                 "selection_samples": len(select), "quantized_nodes": result.quantized, "kept_float_nodes": len(result.kept),
                 "trials": q.trials}
        warnings = list(result.notes)
        details = [{"node": n, "op": op, "action": "quantized", "format": f"int8 qdq ({opts.int8_activations} activations)"}
                   for n, op in result.quantized_nodes]
        details += [{"node": n, "op": op, "action": "skipped", "reason": "kept in float by the selection"}
                    for n, op in result.kept]
        summary = {"int8": {"method": result.method, "methods": result.methods, "segments": result.segments,
                            "kept_segments": result.kept_segments, "kept_nodes": [n for n, _ in result.kept],
                            "closeness": round(result.closeness, 8), "holds": True, "budget": budget,
                            "calibration_samples": len(calib), "selection_samples": len(select),
                            "trials": q.trials, "activations": opts.int8_activations,
                            "weight_bits": 7 if q.reduce_range else 8}}
        return PassResult(model, True, {**stats, "int8": summary["int8"]}, details, warnings)


def reduce_range(activations: str) -> bool:
    """Weights at 7 bits where uint8 activations meet int8 weights on an x86 CPU without VNNI:
    there onnxruntime's u8s8 kernels sum pairs of products in 16 bits (VPMADDUBSW), which
    saturates at 8-bit weights (onnxruntime's quantization guide says to reduce the range on
    AVX2/AVX-512 without VNNI). Measured on the converting machine: what the selection judges
    is what this CPU computes."""
    import platform

    from mcp_compiler.profile import machine

    if activations != "uint8" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    isa = machine().isa
    return not ("vnni" in isa or "amx_int8" in isa)


@dataclass
class _Result:
    proto: object
    method: str
    methods: dict[str, float]
    closeness: float
    segments: int = 0
    kept_segments: list[int] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)
    quantized: int = 0
    quantized_nodes: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Quantizer:
    def __init__(self, model: Model, tmp: Path, calib: list[dict], select: list[dict], opts: QuantizeOptions,
                 budget: dict[str, float]) -> None:
        import onnx

        from mcp_compiler.lower import to_onnx

        self.tmp, self.calib, self.select, self.opts = tmp, calib, select, opts
        self.budget = tightened(budget)
        self.reduce_range = reduce_range(opts.int8_activations)
        proto = to_onnx(model, value_info=False)
        for i, n in enumerate(proto.graph.node):   # the quantizer's nodes_to_exclude names nodes
            if not n.name:
                n.name = f"{n.op_type}_{i}"
        names = [n.name for n in proto.graph.node]
        if len(set(names)) != len(names):
            seen: set[str] = set()
            for i, n in enumerate(proto.graph.node):
                if n.name in seen:
                    n.name = f"{n.name}__{i}"
                seen.add(n.name)
        self.nodes = [(n.name, n.op_type) for n in proto.graph.node]
        self.src = tmp / "float.onnx"
        if proto.ByteSize() > 1_800_000_000:
            raise UnsupportedError("--quantize int8: models over 1.8 GB are not quantized here (onnxruntime's "
                                   "quantizer holds them in one protobuf)")
        onnx.save(proto, self.src)
        self.reference = self._outputs(self.src)
        self.trials = 0
        self.excluded_by_user = [name for name, _ in self.nodes if opts.excluded(name)]

    # -- one quantization and its judgement on the selection samples ----------------------------
    def quantize(self, method: str, exclude: list[str]):  # noqa: ANN202 - (onnx.ModelProto, its path)
        import onnx
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

        out = self.tmp / f"q{self.trials}.onnx"
        cm = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[method]
        act = QuantType.QUInt8 if self.opts.int8_activations == "uint8" else QuantType.QInt8
        with _quiet():
            try:
                quantize_static(str(self.src), str(out), _Reader(self.calib), quant_format=QuantFormat.QDQ,
                                per_channel=True, activation_type=act, weight_type=QuantType.QInt8,
                                reduce_range=self.reduce_range,
                                calibrate_method=cm, nodes_to_exclude=sorted(set(exclude) | set(self.excluded_by_user)),
                                calibration_cache_path=str(self.tmp / f"ranges-{method}.json"),
                                extra_options={"CalibPercentile": 99.999} if method == "percentile" else {})
            except (ValueError, RuntimeError, KeyError, TypeError, IndexError) as e:
                raise UnsupportedError(f"--quantize int8: onnxruntime's quantizer cannot take this model "
                                       f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})") from None
        self.trials += 1
        return onnx.load(str(out)), out

    def judge(self, path: Path) -> Trial:
        from mcp_compiler.accuracy import _compare, closeness, missed

        got = self._outputs(path)
        worst, bad = 1.0, []
        for i, (name, want) in enumerate(self.reference.items()):
            o = _compare(name, want, [g[i] for g in got])
            worst = min(worst, closeness(o))
            bad += [f"output {name!r}: {m}" for m in missed(o, self.budget)]
        return Trial(frozenset(), worst, not bad, bad)

    def _outputs(self, path: Path):  # noqa: ANN202
        import onnxruntime as ort

        from mcp_compiler.accuracy import comparable
        from mcp_compiler.session import quiet_options

        sess = ort.InferenceSession(str(path), quiet_options(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        rows = [sess.run(names, s) for s in self.select]
        if not hasattr(self, "reference"):
            keep = [i for i in range(len(names)) if all(comparable(r[i]) for r in rows)]
            if not keep:
                raise AccuracyError("--quantize int8: no output of the model is a number, an integer or a boolean: "
                                    "nothing to judge the quantization by")
            self.keep = keep
            return {names[i]: [r[i] for r in rows] for i in keep}
        return [[r[i] for i in self.keep] for r in rows]

    # -- the search ------------------------------------------------------------------------------
    def run(self, search: bool) -> _Result:
        methods = [self.opts.calibration_method] if self.opts.calibration_method != "auto" else ["minmax", "percentile"]
        tried: dict[str, tuple[Trial, object]] = {}
        for m in methods:
            proto, path = self.quantize(m, [])
            tried[m] = (self.judge(path), proto)
        method = max(tried, key=lambda m: tried[m][0].closeness)
        trial, proto = tried[method]
        res = _Result(proto, method, {m: round(t.closeness, 8) for m, (t, _) in tried.items()}, trial.closeness)
        if trial.holds:
            return self._finish(res, proto, set())
        if not search:
            raise AccuracyError(f"int8 ({method} calibration) is outside the budget on the selection samples: "
                                f"{trial.missed[0]}; --auto-exclude keeps the nodes that break it in float")
        segments = self._segments()
        res.segments = len(segments)
        if len(segments) < 2:
            raise AccuracyError(f"int8 is outside the budget ({trial.missed[0]}) and the model has too few compute "
                                "nodes to keep some in float: keep it at f32")
        every = set(range(len(segments)))

        def attempt(kept: set[int]) -> tuple[Trial, object]:
            exclude = [n for s in kept for n in segments[s]]
            p, path = self.quantize(method, exclude)
            t = self.judge(path)
            t.excluded = frozenset(kept)
            return t, p

        alone = {s: attempt(every - {s})[0].closeness for s in range(len(segments))}
        order = sorted(alone, key=lambda s: alone[s])     # the most damaging first
        lo, hi = 0, len(order)          # keeping order[:hi] holds (all kept = the float model)
        best = None
        while lo < hi:
            mid = (lo + hi) // 2
            t, p = attempt(set(order[:mid]))
            if t.holds:
                hi, best = mid, (t, p)
            else:
                lo = mid + 1
        if best is None:
            least = max(alone, key=lambda s: alone[s])
            raise AccuracyError(f"no selection of int8 nodes holds the budget "
                                f"{','.join(f'{k}={v:.10g}' for k, v in self.budget.items())} on the selection samples: "
                                f"everything quantized: {trial.missed[0]}; the least damaging run of nodes alone "
                                f"(run {least + 1} of {len(segments)}) reaches closeness {alone[least]:.8g}; keep the model at f32")
        t, p = best
        # then each kept run given back to int8 where the rest alone still holds (least damaging first):
        # bisection over one order keeps a prefix, and a run inside it may not be needed
        for s_ in sorted(t.excluded, key=lambda s: -alone[s]):
            if len(t.excluded) <= 1:
                break
            t2, p2 = attempt(set(t.excluded) - {s_})
            if t2.holds:
                t, p = t2, p2
        res.closeness = t.closeness
        res.kept_segments = sorted(t.excluded)
        return self._finish(res, p, {n for s in t.excluded for n in segments[s]})

    def _segments(self) -> list[list[str]]:
        """The float model's nodes cut into up to SEGMENTS runs with about equally many compute nodes."""
        compute = [i for i, (_, op) in enumerate(self.nodes) if op in COMPUTE_OPS]
        if not compute:
            return [[n for n, _ in self.nodes]]
        k = min(SEGMENTS, len(compute))
        cuts = [compute[round(j * len(compute) / k)] for j in range(1, k)]
        bounds = [0, *cuts, len(self.nodes)]
        return [[self.nodes[i][0] for i in range(a, b)] for a, b in zip(bounds, bounds[1:]) if b > a]

    def _finish(self, res: _Result, proto, kept: set[str]) -> _Result:  # noqa: ANN001
        ops = dict(self.nodes)
        res.proto = proto
        res.kept = [(n, ops[n]) for n, _ in self.nodes if n in kept or n in self.excluded_by_user]
        dequantized = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
        res.quantized_nodes = [(n.name, n.op_type) for n in proto.graph.node
                               if n.op_type in COMPUTE_OPS and any(i in dequantized for i in n.input)]
        res.quantized = len(res.quantized_nodes)
        if not res.quantized:
            res.notes.append("--quantize int8: no compute node was quantized (every one kept in float)")
        return res


class _Reader:
    """onnxruntime's CalibrationDataReader over the samples."""

    def __init__(self, samples: list[dict]) -> None:
        self.samples = samples
        self.i = 0

    def get_next(self):  # noqa: ANN202 - a sample or None
        if self.i >= len(self.samples):
            return None
        self.i += 1
        return self.samples[self.i - 1]

    def rewind(self) -> None:
        self.i = 0

    def __len__(self) -> int:
        return len(self.samples)

    def set_range(self, start_index: int, end_index: int) -> None:
        self.i = start_index


@contextlib.contextmanager
def _quiet():  # noqa: ANN202 - a context manager
    """onnxruntime's quantizer logs its advice (pre-processing, ...) at WARNING on the root logger
    and prints its calibration's progress on stdout (which --json owns)."""
    import io

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _move_into(model: Model, proto) -> None:  # noqa: ANN001 - onnx.ModelProto
    """The quantized protobuf's contents into `model` (callers hold the Model object)."""
    from mcp_compiler.frontend.onnx import import_by_reference

    new = import_by_reference(proto, [])
    model.graph, model.functions = new.graph, new.functions
    model.opset_imports, model.ir_version = new.opset_imports, new.ir_version
