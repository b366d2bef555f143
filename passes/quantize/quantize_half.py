"""FP16 / BF16 weights: float32 constants stored in half precision, widened once at load."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from mcp_compiler.ir import Attribute, AttrType, DataType, Model, Node, Tensor, Value

from .._infra import Pass, PassContext, PassResult, Property
from . import _weights as W
from .numerics import relative_error
from .options import QuantizeOptions
from .select import Layer, keep_for_budget

HALF = {"fp16": (np.float16, DataType.FLOAT16, 65504.0), "bf16": (ml_dtypes.bfloat16, DataType.BFLOAT16, 3.3895e38)}
BF16_MIN_OPSET = 13   # Cast to/from bfloat16

# Numerically sensitive consumers: a constant feeding one of these stays float32 (their
# constants are small: a LayerNorm's scale, an epsilon, a Pow's exponent, a Range's bounds).
KEEP_FLOAT32 = frozenset({
    "LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
    "SimplifiedLayerNormalization", "SkipLayerNormalization", "RMSNormalization", "LpNormalization",
    "Softmax", "LogSoftmax", "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Div", "Erf",
    "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "ReduceProd",
    "CumSum", "Range", "Resize", "Upsample", "Shape", "Reshape", "Expand", "Tile", "Slice", "Pad",
    "ConstantOfShape", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Where", "Clip",
})


class QuantizeHalfPass(Pass):
    """Rules (a float32 constant of at least --quantize-min-elements values, not excluded, read
    by no node in KEEP_FLOAT32):

    - W -> Cast(W16, to=FLOAT) where W16 holds W rounded to float16 (--quantize fp16) or
      bfloat16 (--quantize bf16); every reader of W reads the Cast.

    Compute stays float32: onnxruntime folds a Cast of a constant when it creates the session,
    so the file is half the size and the served model runs the float32 kernels it ran before
    (this CPU target has no half-precision kernels for most ops). A constant with a value
    beyond the half type's range stays float32 (the report names it): never an inf served. The
    model's inputs and outputs keep their types.
    """

    name = "quantize-half"
    requires = frozenset()
    establishes = frozenset()
    preserves = frozenset({Property.NO_CONSTANT_NODES, Property.LAYOUT_NHWC})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opts = ctx.quantize or QuantizeOptions(mode="fp16")
        np_type, dtype, limit = HALF[opts.mode]
        g = model.graph
        decisions = W.Decisions()
        namer = W.Namer(model)
        interface = {id(v) for v in [*g.inputs, *g.outputs]}
        todo = []
        for v in list(g.initializers.values()):
            t = v.const
            if not isinstance(t, Tensor) or t.dtype != DataType.FLOAT or id(v) in interface or not v.uses:
                continue
            reader = v.uses[0][0]
            why = _skip_reason(v, t, opts)
            if why is not None:
                decisions.skip(reader, why, v)
                continue
            w = t.numpy()
            finite = np.isfinite(w)
            if not finite.all() or float(np.abs(w).max(initial=0.0)) > limit:
                decisions.skip(reader, f"values beyond {opts.mode}'s range (max |w| "
                               f"{float(np.abs(w[finite]).max(initial=0.0)):.4g}) or not finite: kept float32", v)
                continue
            half = np.ascontiguousarray(w.astype(np_type))
            err = relative_error(half.astype(np.float32) - w, w)
            if opts.max_error is not None and err > opts.max_error:
                decisions.skip(reader, f"relative weight error {err:.4f} > --quantize-max-error {opts.max_error}", v)
                continue
            todo.append((v, reader, half, err))
        kept, selection = keep_for_budget(model, ctx, lambda: [
            Layer(v, half.astype(np.float32), v.const.nbytes // 2) for v, _, half, _ in todo])
        new_nodes = []
        for v, reader, half, err in todo:
            t = v.const
            if v.name in kept:
                W.keep_record(decisions, reader, v)
                continue
            hv = W.constant(g, namer, f"{v.name}_{opts.mode}", half)
            wide = Value(namer(f"{v.name}_f32"))
            new_nodes.append(Node("Cast", [hv], [wide], name=namer(f"{v.name}_cast"),
                                  attributes=[Attribute("to", AttrType.INT, int(DataType.FLOAT))]))
            for node, i in list(v.uses):
                node.set_input(i, wide)
            del g.initializers[v.name]
            decisions.rows.append({"node": reader.name, "op": reader.op_type, "weight": v.name,
                                   "shape": list(t.dims), "action": "quantized", "format": f"Cast({opts.mode})",
                                   "rel_error": round(err, 8), "bytes_before": t.nbytes,
                                   "bytes_after": hv.const.nbytes})
        g.nodes = new_nodes + g.nodes
        stats = decisions.stats()
        if selection is not None:
            stats["selection"] = selection
        return PassResult(model, bool(new_nodes), stats, details=decisions.rows)


def _skip_reason(v: Value, t: Tensor, opts: QuantizeOptions) -> str | None:
    if t.numel < max(opts.min_elements, 1):
        return f"too small ({t.numel} elements < {opts.min_elements})"
    for node, _ in v.uses:
        pat = opts.excluded(node.name, v.name)
        if pat:
            return f"excluded by --quantize-exclude {pat}"
        if node.op_type in KEEP_FLOAT32 or (node.op_type == "Cast"):
            return f"read by {node.op_type} (kept in float32: numerically sensitive or shape arithmetic)"
    return None
