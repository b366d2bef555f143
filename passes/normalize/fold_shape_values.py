"""Shape arithmetic on known dims -> constants (Shape -> Gather -> Unsqueeze -> Concat -> Reshape)."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import DataType, Graph, Model, TensorType

from .. import _rewrite as R
from .._infra import ALL, Pass, PassContext, PassResult, Property

_INT = {DataType.INT64: np.int64, DataType.INT32: np.int32}


class FoldShapeValuesPass(Pass):
    """Rule: an integer tensor computed from shapes (Shape, Size, and Gather, Slice, Concat,
    Unsqueeze, Squeeze, Cast, Reshape, Add, Sub, Mul, Div, Max, Min over them) whose every
    element symbolic shape inference proves static -> that constant.

    Shapes come from the symbolic inference of `infer-shapes` (passes/shapes): a Shape of
    [N, 80, 40] gathered at index 1 is 80 whatever N is, where ONNX's own inference leaves it
    unknown and constant folding cannot fold a Shape of a dynamic value. Exact: the same integers.
    The shape subgraph that made it goes with dead-code elimination. In If branches and loop
    bodies too (they see the values of the graphs around them). Not applied to graph outputs
    or to values of more than 64 elements.
    """

    name = "fold-shape-values"
    requires = frozenset()
    establishes = frozenset()
    preserves = ALL - {Property.NO_DEAD_CODE, Property.UNIQUE_WEIGHTS}
    idempotent = True

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        from ..shapes.symbolic_shapes import model_symbols

        if not any(n.op_type in ("Shape", "Size") and n.is_onnx() for n in model.graph.walk()):
            return PassResult(model, False, {"values_folded": 0, "reshape_targets": 0})   # nothing computes shapes
        counts = [0, 0]
        _fold_graph(model.graph, model.onnx_opset, model_symbols(model), None, counts)
        return PassResult(model, sum(counts) > 0, {"values_folded": counts[0], "reshape_targets": counts[1]})


def _fold_graph(g: Graph, opset: int, taken: set[str], outer, counts: list[int]) -> None:  # noqa: ANN001 - Inference
    """Fold g's shape values, then those of its subgraphs (which see g's values as inferred)."""
    from ..shapes.symbolic_shapes import Inference

    inf = Inference(g, opset, taken=taken, outer=outer)
    inf.run()
    outputs = {id(v) for v in g.outputs}
    names = None
    for n in g.nodes:
        if not n.is_onnx() or n.op_type in ("Constant",) or not n.outputs:
            continue
        v = n.outputs[0]
        vals, shape = inf.values.get(id(v)), inf.shapes.get(id(v))
        dtype = _int_type(v, n)
        if vals is None or id(v) in outputs or not v.uses or dtype is None or shape is None \
                or len(shape) > 1 or not all(isinstance(d, int) for d in vals):
            continue
        if (shape == () and len(vals) != 1) or (len(shape) == 1 and shape[0] != len(vals)):
            continue
        names = names if names is not None else R.value_names(g)
        c = R.new_constant(g, names, f"{v.name}__folded", np.array(vals, dtype=_INT[dtype]).reshape(shape))
        v.replace_all_uses_with(c)
        counts[0] += 1
    for n in g.nodes:
        allowzero = n.attributes.get("allowzero")
        if n.is_onnx("Reshape") and len(n.inputs) == 2 and not (allowzero is not None and allowzero.value):
            target = _reshape_target(n, inf)
            if target is not None:
                names = names if names is not None else R.value_names(g)
                n.set_input(1, R.new_constant(g, names, f"{n.outputs[0].name}__shape", target))
                counts[1] += 1
    for n in g.nodes:
        for sub in n.subgraphs():
            if any(m.op_type in ("Shape", "Size") and m.is_onnx() for m in sub.walk()):
                _fold_graph(sub, opset, taken, inf, counts)


def _reshape_target(n, inf) -> np.ndarray | None:  # noqa: ANN001
    """A computed Reshape target whose symbolic entries are the input's dims at the same
    positions (or a single other one): [80, 0, 768] (0 copies the input's dim), or -1."""
    t, x = n.inputs[1], n.inputs[0]
    vals, shape = inf.values.get(id(t)), inf.shapes.get(id(x))
    if t.const is not None or vals is None or shape is None or all(isinstance(d, int) for d in vals):
        return None
    out, unknown = [], 0
    for i, d in enumerate(vals):
        if isinstance(d, int):
            if d == 0:
                return None   # 0 already means "copy": leave such targets alone
            out.append(d)
        elif i < len(shape) and shape[i] == d:
            out.append(0)
        else:
            out.append(-1)
            unknown += 1
    return np.array(out, np.int64) if unknown <= 1 and -1 not in [d for d in vals if isinstance(d, int)] else None


def _int_type(v, n) -> DataType | None:  # noqa: ANN001
    """The value's integer element type (declared, or what its op makes), or None."""
    from ..shapes.symbolic_shapes import derive_type

    t = v.type if isinstance(v.type, TensorType) and v.type.elem_type else derive_type(v, n)
    return DataType(t.elem_type) if t is not None and DataType(t.elem_type) in _INT else None
