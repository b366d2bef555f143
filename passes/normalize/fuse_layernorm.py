"""Fuse the exported layer-norm and RMS-norm arithmetic into LayerNormalization / RMSNormalization."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Attribute, AttrType, Model, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES, Property
from .._pattern import Const, Match, Op, Or, Var
from .._rules import RewriteContext, Rule, RuleSetPass, broadcasts_like_x


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

# tf2onnx's batch-norm-style lowering of keras LayerNormalization:
#   s = gamma * Rsqrt(ReduceMean((x - mean)^2) + eps);  y = x * s + (beta - mean * s)
MEAN = Op("ReduceMean", X, name="mean", where=_over_last_axis, more_inputs=True)
_VAR_EPS = Op("Add", _mean(_square(Op("Sub", X, MEAN, name="d"))), Const(name="eps"), name="ve")


def _rsqrt(name: str | None) -> Or:
    return Or(Op("Reciprocal", Op("Sqrt", _VAR_EPS), name=name), Op("Pow", _VAR_EPS, Const(-0.5), name=name),
              Op("Div", Const(1.0), Op("Sqrt", _VAR_EPS), name=name))


SCALE = Or(Op("Mul", _rsqrt(None), Var("gamma"), name="s"), _rsqrt("s"))
TF_LAYERNORM = Op("Add", Op("Mul", X, SCALE), Op("Sub", Var("beta"), Op("Mul", MEAN, SCALE)))


def _tf_check(m: Match, model: Model) -> str | None:
    c = R.shape(m["x"])[-1]
    for k in ("gamma", "beta"):
        if k in m.bound:
            a = R.const(m[k])
            if a is None or a.dtype != np.float32 or a.shape != (c,):
                return f"{k} is not a float32 constant of shape [{c}]"
    return broadcasts_like_x(m, model)


def _tf_fused(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    c = R.shape(m["x"])[-1]
    gamma = m.bound.get("gamma") or rc.constant(f"{y.name}_scale", np.ones(c, np.float32))
    return [Node("LayerNormalization", [m["x"], gamma, m["beta"]], [y], name=m.nodes[-1].name or y.name,
                 attributes=[Attribute("axis", AttrType.INT, -1), Attribute("epsilon", AttrType.FLOAT, m.scalar("eps"))])]


def _fused(op: str):  # noqa: ANN202
    def replace(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
        x, c = m["x"], R.shape(m["x"])[-1]
        scale = m.bound.get("Mul") or rc.constant(f"{y.name}_scale", np.ones(c, np.float32))
        inputs = [x, scale] + ([m.bound["Add"]] if "Add" in m.bound else [])
        return [Node(op, inputs, [y], name=m.nodes[-1].name or y.name,
                     attributes=[Attribute("axis", AttrType.INT, -1), Attribute("epsilon", AttrType.FLOAT, m.scalar("eps"))])]
    return replace


def _affine(ops: tuple[str, ...]):  # noqa: ANN202
    return lambda m, outputs: _affine_nodes(m, outputs, ops)


def _affine_nodes(m: Match, outputs: set[int], ops: tuple[str, ...]) -> list[Node]:
    """The Mul (gamma) and Add (beta) by float32 [C] constants that follow the norm, in that
    order, each where present (bound in the match as "Mul" and "Add")."""
    c = R.shape(m["x"])[-1]
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
        m.bound[op] = other
        nodes.append(nxt)
    return nodes[len(m.nodes):]


class FuseLayerNormPass(RuleSetPass):
    """Rules (x float32 with a static last dim C; the intermediates used only in the pattern;
    means over the last axis with keepdims; eps a constant with one element):

        d = x - ReduceMean(x)
        d / Sqrt(ReduceMean(d^2) + eps) [* gamma] [+ beta]  -> LayerNormalization(x, gamma or 1, beta,
                                                               axis=-1, epsilon=eps)    (opset 17+)
        x / Sqrt(ReduceMean(x^2) + eps) [* gamma]           -> RMSNormalization(x, gamma or 1,
                                                               axis=-1, epsilon=eps)    (opset 23+)

        x * s + (beta - mean * s), s = [gamma *] Rsqrt(ReduceMean((x - mean)^2) + eps)
                                                            -> LayerNormalization(x, gamma or 1, beta)
                                                               (tf2onnx's lowering of keras' layer norm;
                                                               Rsqrt as Reciprocal(Sqrt), Pow(., -0.5), 1 / Sqrt)

    with Pow(v, 2) or v * v for v^2, and a * Reciprocal(b) for a / b; gamma and beta float32
    constants of shape [C]. Where the model's opset lacks the op (--opset raises it) the rule
    is left out. The fused kernels compute the same mean and variance in float32 in another
    order (tests: rtol 1e-4, atol 1e-5).
    """

    name = "fuse-layernorm"
    requires = frozenset({Property.SHAPES_INFERRED})
    establishes = frozenset()
    preserves = REWRITES

    rounds = ((Rule("LayerNormalization", LAYERNORM, _fused("LayerNormalization"), broadcasts_like_x, 17,
                    _affine(("Mul", "Add"))),
               Rule("RMSNormalization", RMSNORM, _fused("RMSNormalization"), broadcasts_like_x, 23, _affine(("Mul",))),
               Rule("LayerNormalization_tf", TF_LAYERNORM, _tf_fused, _tf_check, 17)),)

    def not_applicable(self, model: Model) -> str | None:
        opset = model.onnx_opset
        return f"opset {opset} < 17 (--opset 17 enables it)" if opset is not None and opset < 17 else None
