"""FP8 weights (E4M3FN or E5M2) behind DequantizeLinear, with optional static activation Q/DQ."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Attribute, AttrType, Model, Node, Value

from .._infra import Pass, PassContext, PassResult, Property
from . import _weights as W
from .numerics import FP8_MAX, FP8_TYPES, quantize_fp8
from .options import QuantizeOptions
from .select import Layer, keep_for_budget

MIN_OPSET = 19   # DequantizeLinear / QuantizeLinear with float8


class QuantizeFp8Pass(Pass):
    """Rules (W constant float32, at least --quantize-min-elements values, not excluded):

    - MatMul(A, W[K,N]) -> MatMul(A, DequantizeLinear(q float8 [K,N], scale[N], axis=1))
    - Gemm(A, B, C) -> Gemm(A, DequantizeLinear(q, scale), beta*C), transB and alpha folded into W
    - Conv (with --quantize-conv): W[M,...] -> DequantizeLinear(q, scale[M], axis=0) -> Conv
    - with calibration samples (ctx.calibration): A -> QuantizeLinear(A, s, float8 0) ->
      DequantizeLinear(., s) in front of each quantized node, s = max|A| observed / FP8 max

    scale = max|w| / 448 (E4M3FN) or / 57344 (E5M2), per output channel (default) or per tensor;
    q = w / scale rounded to the nearest float8 by ml_dtypes after clipping to the finite range.
    Needs ai.onnx opset >= 19 (the pipeline upgrades older models first).
    """

    name = "quantize-fp8"
    requires = frozenset()
    establishes = frozenset()
    preserves = frozenset({Property.NO_CONSTANT_NODES, Property.LAYOUT_NHWC})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opts = ctx.quantize or QuantizeOptions(mode="fp8")
        opset = model.onnx_opset
        if opset < MIN_OPSET:
            raise ValueError(f"float8 DequantizeLinear needs ai.onnx opset >= {MIN_OPSET}, the model "
                             f"imports {opset} (run upgrade-opset first)")
        g = model.graph
        decisions = W.Decisions()
        namer = W.Namer(model)
        chosen = W.candidates(g, opts, decisions)
        amax = _activation_ranges(model, chosen, ctx.calibration) if ctx.calibration else {}
        replacements: dict[int, list[Node]] = {}
        originals = []
        activations = 0
        fmt = opts.fp8_format
        axis_of = lambda c: (0 if c.node.op_type == "Conv" else 1) if opts.per_channel else None  # noqa: E731
        quantized = W.parallel_map(lambda c: quantize_fp8(c.w, fmt, axis_of(c)), chosen)
        passing = [(c, q, err) for c, q in zip(chosen, quantized)
                   if (err := W.check_error(c, q.rel_error, opts, decisions)) is not None]
        kept, selection = keep_for_budget(model, ctx, lambda: [
            Layer(c.weight, W.stand_in(c, q.dequantize()), c.weight.const.nbytes * 3 // 4) for c, q, _ in passing])
        for c, q, err in passing:
            n = c.node
            axis = axis_of(c)
            if c.weight.name in kept:
                W.keep_record(decisions, c.node, c.weight)
                continue
            before = c.weight.const.nbytes
            originals += [v for v in n.inputs[1:] if v is not None]
            base = c.weight.name
            qc = W.constant(g, namer, f"{base}_f8", q.q)
            sc = W.constant(g, namer, f"{base}_scale", q.scale)
            deq = Value(namer(f"{base}_dq"))
            attrs = [Attribute("axis", AttrType.INT, axis)] if axis is not None else []
            new = [Node("DequantizeLinear", [qc, sc], [deq], name=namer(f"{n.name or base}_dq"), attributes=attrs)]
            a = n.inputs[0]
            if id(a) in amax:
                new += _activation_qdq(g, namer, n, a, amax[id(a)], fmt)
                activations += 1
            if n.op_type == "Gemm":
                for k in ("transB", "alpha", "beta"):
                    n.attributes.pop(k, None)
                if c.bias is not None:
                    n.set_input(2, W.constant(g, namer, f"{base}_bias", c.bias))
            n.set_input(1, deq)
            replacements[id(n)] = [*new, n]
            decisions.done(c, err, f"DequantizeLinear({fmt})", before, qc.const.nbytes + sc.const.nbytes)
        W.splice(g, replacements)
        W.drop_unused_weights(g, originals)
        stats = decisions.stats()
        stats["activations_quantized"] = activations
        if selection is not None:
            stats["selection"] = selection
        return PassResult(model, bool(replacements), stats, details=decisions.rows)


def _activation_qdq(g, namer, n: Node, a: Value, amax: float, fmt: str) -> list[Node]:  # noqa: ANN001
    scale = np.float32(amax / FP8_MAX[fmt]) if amax > 0 else np.float32(1.0)
    base = a.name or "act"
    s = W.constant(g, namer, f"{base}_act_scale", np.asarray(scale, np.float32))
    z = W.constant(g, namer, f"{base}_act_zp", np.zeros((), FP8_TYPES[fmt]))
    qv, dv = Value(namer(f"{base}_act_f8")), Value(namer(f"{base}_act_dq"))
    q = Node("QuantizeLinear", [a, s, z], [qv], name=namer(f"{n.name or base}_act_q"))
    d = Node("DequantizeLinear", [qv, s, z], [dv], name=namer(f"{n.name or base}_act_dq"))
    n.set_input(0, dv)
    return [q, d]


def _activation_ranges(model: Model, chosen: list[W.Candidate], samples: list[dict]) -> dict[int, float]:
    """max |A| over the calibration samples, for the activation input of each candidate."""
    acts = list({id(c.node.inputs[0]): c.node.inputs[0] for c in chosen
                 if c.node.inputs[0] is not None and c.node.inputs[0].const is None}.values())
    amax = {id(a): 0.0 for a in acts}
    if not acts:
        return amax
    for values in W.run_with_outputs(model, acts, samples):
        for a in acts:
            amax[id(a)] = max(amax[id(a)], float(np.abs(values[a.name]).max(initial=0.0)))
    return amax
