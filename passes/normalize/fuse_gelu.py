"""Fuse the exported GELU arithmetic (erf or tanh form) into Gelu (opset 20+)."""

from __future__ import annotations

import math

from mcp_compiler.ir import Attribute, AttrType, Model, Node

from .. import _rewrite as R
from .._infra import Pass, PassContext, PassResult
from .._pattern import Const, Op, Or, Var, match

X = Var("x", where=R.is_float32)
HALF, ONE = Const(0.5), Const(1.0)
ERF_TERM = Op("Add", Op("Erf", Or(Op("Div", X, Const(math.sqrt(2))), Op("Mul", X, Const(1 / math.sqrt(2))))), ONE)
CUBE = Or(Op("Pow", X, Const(3.0)), Op("Mul", X, Op("Mul", X, X)), Op("Mul", Op("Mul", X, X), X))
TANH_TERM = Op("Add", Op("Tanh", Op("Mul", Const(math.sqrt(2 / math.pi)),
                                    Op("Add", X, Op("Mul", Const(0.044715), CUBE)))), ONE)


def gelu_of(term: Op) -> Or:
    """x * term / 2, in the three groupings exporters write."""
    return Or(Op("Mul", Op("Mul", X, term), HALF), Op("Mul", Op("Mul", X, HALF), term),
              Op("Mul", X, Op("Mul", term, HALF)))


RULES = {"erf": (gelu_of(ERF_TERM), "none"), "tanh": (gelu_of(TANH_TERM), "tanh")}


class FuseGeluPass(Pass):
    """Rules (x float32; constants with one element; intermediates used only in the pattern;
    operands of Add/Mul in either order):

        x * (Erf(x / sqrt(2)) + 1) * 0.5                               -> Gelu(x)
        x * (Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)) + 1) * 0.5        -> Gelu(x, approximate="tanh")

    with x * 1/sqrt(2) for x / sqrt(2), Pow(x, 3) or x * x * x for x^3, and the product grouped
    as (x * t) * 0.5, (x * 0.5) * t or x * (t * 0.5). Only where the model's opset has Gelu
    (20+; --opset 20 raises an older model). The same function, rounded differently in the
    last bits (tests: rtol 1e-5, atol 1e-6).
    """

    name = "fuse-gelu"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opset = model.onnx_opset
        if opset < 20:
            return PassResult(model, False, {"fused": 0, "reason": f"opset {opset} < 20 (--opset 20 enables it)"})
        fused = dict.fromkeys(RULES, 0)
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            splice = R.Splice(g)
            for root in g.nodes:
                if root.op_type != "Mul":
                    continue
                for form, (pattern, approximate) in RULES.items():
                    m = match(pattern, root, outputs)
                    if m is None or splice.taken(m.nodes) or not m.broadcasts_like(m["x"]):
                        continue
                    y = root.outputs[0]
                    attrs = [Attribute("approximate", AttrType.STRING, b"tanh")] if approximate != "none" else []
                    splice.free(m.nodes)
                    splice.replace(m.nodes, [Node("Gelu", [m["x"]], [y], name=root.name or y.name,
                                                  attributes=attrs)])
                    fused[form] += 1
                    break
            splice.apply()
        return PassResult(model, any(fused.values()), {"fused": sum(fused.values()), **fused})
