"""Fuse the exported layer-norm and RMS-norm arithmetic into LayerNormalization / RMSNormalization."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Attribute, AttrType, Model, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES, Pass, PassContext, PassResult, Property
from .._pattern import Const, Match, Op, Or, Var, match


def _last_dim_static(v: Value) -> bool:
    shape = R.shape(v)
    return R.is_float32(v) and bool(shape) and isinstance(shape[-1], int)


def _over_last_axis(n: Node) -> bool:
    """ReduceMean over the last axis only, keeping dims (axes as attribute, or input at 18+)."""
    keep = n.attributes.get("keepdims")
    if keep is not None and keep.value != 1:
        return False
    if len(n.inputs) > 1 and n.inputs[1] is not None:
        a = R.const(n.inputs[1])
        axes = None if a is None else [int(i) for i in a.reshape(-1)]
    else:
        attr = n.attributes.get("axes")
        axes = None if attr is None else list(attr.value)
    shape = R.shape(n.inputs[0])
    rank = len(shape) if shape is not None else -1
    return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)


def _mean(of: Op | Or | Var) -> Op:
    return Op("ReduceMean", of, where=_over_last_axis, more_inputs=True)


def _square(v: Op | Var) -> Or:
    return Or(Op("Pow", v, Const(2.0)), Op("Mul", v, v))


def _over(num: Op | Var, root: Op) -> Or:
    """num / root, or num * Reciprocal(root)."""
    return Or(Op("Div", num, root), Op("Mul", num, Op("Reciprocal", root)))


X = Var("x", where=_last_dim_static)
D = Op("Sub", X, _mean(X), name="d")        # named: the same node in both places below
LAYERNORM = _over(D, Op("Sqrt", Op("Add", _mean(_square(D)), Const(name="eps"))))
RMSNORM = _over(X, Op("Sqrt", Op("Add", _mean(_square(X)), Const(name="eps"))))
#        op, pattern, opset that has the op, its trailing affine ops
RULES = (("LayerNormalization", LAYERNORM, 17, ("Mul", "Add")),
         ("RMSNormalization", RMSNORM, 23, ("Mul",)))


class FuseLayerNormPass(Pass):
    """Rules (x float32 with a static last dim C; the intermediates used only in the pattern;
    means over the last axis with keepdims; eps a constant with one element):

        d = x - ReduceMean(x)
        d / Sqrt(ReduceMean(d^2) + eps) [* gamma] [+ beta]  -> LayerNormalization(x, gamma or 1, beta,
                                                               axis=-1, epsilon=eps)    (opset 17+)
        x / Sqrt(ReduceMean(x^2) + eps) [* gamma]           -> RMSNormalization(x, gamma or 1,
                                                               axis=-1, epsilon=eps)    (opset 23+)

    with Pow(v, 2) or v * v for v^2, and a * Reciprocal(b) for a / b; gamma and beta float32
    constants of shape [C]. Where the model's opset lacks the op (--opset raises it) the rule
    is left out. The fused kernels compute the same mean and variance in float32 in another
    order (tests: rtol 1e-4, atol 1e-5).
    """

    name = "fuse-layernorm"
    requires = frozenset({Property.SHAPES_INFERRED})
    establishes = frozenset()
    preserves = REWRITES

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opset = model.onnx_opset
        rules = [r for r in RULES if opset >= r[2]]
        if not rules:
            return PassResult(model, False, {"fused": 0, "reason": f"opset {opset} < 17 (--opset 17 enables it)"})
        fused = {op: 0 for op, *_ in rules}
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            names = R.value_names(g)
            splice = R.Splice(g)
            for root in g.nodes:
                if root.op_type not in ("Div", "Mul"):
                    continue
                for op, pattern, _, affine in rules:
                    m = match(pattern, root, outputs)
                    if m is None or splice.taken(m.nodes) or not m.broadcasts_like(m["x"]):
                        continue
                    x, c = m["x"], R.shape(m["x"])[-1]
                    params, nodes = _affine(m, outputs, c, affine)
                    if splice.taken(nodes):
                        continue
                    y = nodes[-1].outputs[0]
                    if "Mul" not in params:
                        params["Mul"] = R.new_constant(g, names, f"{y.name}_scale", np.ones(c, np.float32))
                    inputs = [x, params["Mul"]] + ([params["Add"]] if "Add" in params else [])
                    splice.free(nodes)
                    splice.replace(nodes, [Node(op, inputs, [y], name=nodes[-1].name or y.name,
                                                attributes=[Attribute("axis", AttrType.INT, -1),
                                                            Attribute("epsilon", AttrType.FLOAT, m.scalar("eps"))])])
                    fused[op] += 1
                    break
            splice.apply()
        return PassResult(model, any(fused.values()), {"fused": sum(fused.values()), **fused})


def _affine(m: Match, outputs: set[int], c: int, ops: tuple[str, ...]) -> tuple[dict[str, Value], list[Node]]:
    """The float32 [C] constants of the Mul (gamma) and Add (beta) that follow the norm, in
    that order, each where present; and the pattern's nodes extended over them."""
    params: dict[str, Value] = {}
    nodes = list(m.nodes)
    for op in ops:
        y = nodes[-1].outputs[0]
        nxt = R.only_use(y, outputs)
        if nxt is None or nxt.op_type != op or not nxt.is_onnx() or len(nxt.inputs) != 2:
            continue
        other = nxt.inputs[1] if nxt.inputs[0] is y else nxt.inputs[0]
        a = R.const(other)
        if a is None or a.dtype != np.float32 or a.shape != (c,):
            continue
        params[op] = other
        nodes.append(nxt)
    return params, nodes
