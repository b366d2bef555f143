"""Fuse the exported layer-norm arithmetic into LayerNormalization (opset 17+)."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Attribute, AttrType, Model, Node, TensorType

from .. import _rewrite as R
from .._infra import Pass, PassContext, PassResult


class FuseLayerNormPass(Pass):
    """Rule (x float32 with a static last dim C; the intermediates used only in the pattern):

        d = Sub(x, ReduceMean(x, axes=[-1]))
        Div(d, Sqrt(Add(ReduceMean(Pow(d, 2) or Mul(d, d), axes=[-1]), eps)))
          [-> Mul(., gamma)] [-> Add(., beta)]     gamma, beta float32 constants of shape [C]
        -> LayerNormalization(x, gamma or ones[C], beta, axis=-1, epsilon=eps)

    Only where the model's opset has LayerNormalization (17+). The fused kernel computes the
    same mean and variance in float32 in another order (tests: rtol 1e-4, atol 1e-5).
    """

    name = "fuse-layernorm"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        if opset < 17:
            return PassResult(model, False, {"fused": 0, "reason": f"opset {opset} < 17"})
        fused = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            names = R.value_names(g)
            splice = R.Splice(g)
            for div in g.nodes:
                m = _match(div, outputs, opset)
                if m is None or splice.taken(m[3]):
                    continue
                x, eps, c, nodes = m
                gamma, beta, nodes = _affine(nodes, outputs, c)
                y = nodes[-1].outputs[0]
                if gamma is None:
                    gamma = R.new_constant(g, names, f"{y.name}_scale", np.ones(c, np.float32))
                splice.free(nodes)
                splice.replace(nodes, [Node("LayerNormalization", [x, gamma] + ([beta] if beta else []), [y],
                                            name=nodes[-1].name or y.name,
                                            attributes=[Attribute("axis", AttrType.INT, -1),
                                                        Attribute("epsilon", AttrType.FLOAT, eps)])])
            fused += splice.apply()
        return PassResult(model, fused > 0, {"fused": fused})


def _reduce_last_axis(n: Node | None, opset: int, rank: int) -> bool:
    if n is None or n.attributes.get("keepdims") is not None and n.attributes["keepdims"].value != 1:
        return False
    if opset >= 18:
        axes = R.const(n.inputs[1]) if len(n.inputs) > 1 else None
        axes = None if axes is None else [int(a) for a in axes.reshape(-1)]
    else:
        a = n.attributes.get("axes")
        axes = None if a is None else list(a.value)
    return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)


def _match(div: Node, outputs: set[int], opset: int):  # noqa: ANN202
    """(x, epsilon, C, pattern nodes ending with div) when div ends a layer norm."""
    if div.op_type != "Div" or div.domain not in ("", "ai.onnx"):
        return None
    d, s = div.inputs
    sub, sqrt = R.producer(d, "Sub"), R.producer(s, "Sqrt")
    if sub is None or sqrt is None or R.only_use(s, outputs) is not div:
        return None
    x, mean = sub.inputs
    t = x.type if x is not None else None
    if not R.is_float32(x) or not isinstance(t, TensorType) or not t.shape or not isinstance(t.shape[-1], int):
        return None
    rank, c = len(t.shape), t.shape[-1]
    rm1 = R.producer(mean, "ReduceMean")
    if rm1 is None or rm1.inputs[0] is not x or not _reduce_last_axis(rm1, opset, rank) \
            or R.only_use(mean, outputs) is not sub:
        return None
    add = R.producer(sqrt.inputs[0], "Add")
    if add is None or R.only_use(add.outputs[0], outputs) is not sqrt:
        return None
    var, eps_v = add.inputs
    eps = R.scalar(eps_v)
    if eps is None:
        var, eps = eps_v, R.scalar(var)
    rm2 = R.producer(var, "ReduceMean")
    if eps is None or rm2 is None or not _reduce_last_axis(rm2, opset, rank) or R.only_use(var, outputs) is not add:
        return None
    sq = rm2.inputs[0].producer if rm2.inputs[0] is not None else None
    if sq is None or R.only_use(rm2.inputs[0], outputs) is not rm2:
        return None
    if sq.op_type == "Pow" and sq.inputs[0] is d and R.scalar(sq.inputs[1]) == 2.0:
        pass
    elif sq.op_type == "Mul" and sq.inputs[0] is d and sq.inputs[1] is d:
        pass
    else:
        return None
    if id(d) in outputs or {id(n) for n, _ in d.uses} != {id(sq), id(div)}:
        return None
    return x, eps, c, [rm1, sub, sq, rm2, add, sqrt, div]


def _per_channel(v, c: int):  # noqa: ANN001, ANN202 - a constant usable as scale/bias of [C]
    a = R.const(v)
    if a is None or a.dtype != np.float32:
        return None
    return a if a.shape == (c,) else None


def _affine(nodes: list[Node], outputs: set[int], c: int):  # noqa: ANN202
    """gamma, beta (values of shape [C], or None) and the pattern extended over Mul/Add."""
    gamma = beta = None
    for op in ("Mul", "Add"):
        y = nodes[-1].outputs[0]
        nxt = R.only_use(y, outputs)
        if nxt is None or nxt.op_type != op or nxt.domain not in ("", "ai.onnx") or len(nxt.inputs) != 2:
            continue
        other = nxt.inputs[1] if nxt.inputs[0] is y else nxt.inputs[0]
        if _per_channel(other, c) is None:
            continue
        if op == "Mul":
            gamma = other
        else:
            beta = other
        nodes = nodes + [nxt]
    return gamma, beta, nodes
