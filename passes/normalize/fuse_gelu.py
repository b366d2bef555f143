"""Fuse the exported erf-GELU arithmetic into Gelu (opset 20+)."""

from __future__ import annotations

import math

from mcp_compiler.ir import Model, Node

from .. import _rewrite as R
from .._infra import Pass, PassContext, PassResult


class FuseGeluPass(Pass):
    """Rule (x float32; the constants scalars; the intermediates used only in the pattern):

        Mul(Mul(x, Add(Erf(Div(x, sqrt(2))), 1)), 0.5)       -> Gelu(x)
        Mul(Mul(x, 0.5), Add(Erf(Div(x, sqrt(2))), 1))       -> Gelu(x)

    Mul by 1/sqrt(2) instead of Div by sqrt(2), and either operand order of Add/Mul, match too.
    Only where the model's opset has Gelu (20+). Same function, rounded differently in the
    last bits (tests: rtol 1e-5, atol 1e-6).
    """

    name = "fuse-gelu"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        if opset < 20:
            return PassResult(model, False, {"fused": 0, "reason": f"opset {opset} < 20"})
        fused = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            splice = R.Splice(g)
            for last in g.nodes:
                m = _match(last, outputs)
                if m is None or splice.taken(m[1]):
                    continue
                x, nodes = m
                y = last.outputs[0]
                splice.free(nodes)
                splice.replace(nodes, [Node("Gelu", [x], [y], name=last.name or y.name)])
            fused += splice.apply()
        return PassResult(model, fused > 0, {"fused": fused})


def _near(v: float | None, want: float) -> bool:
    return v is not None and abs(v - want) <= 1e-6 * abs(want)


def _operands(n: Node, op: str):  # noqa: ANN202 - (a, b) of a binary ai.onnx node
    if n is None or n.op_type != op or n.domain not in ("", "ai.onnx") or len(n.inputs) != 2:
        return None
    return n.inputs


def _scaled(n: Node, outputs: set[int]):  # noqa: ANN202
    """(x, [nodes]) when n is Erf(x / sqrt 2) + 1."""
    ab = _operands(n, "Add")
    if ab is None:
        return None
    e = ab[0] if _near(R.scalar(ab[1]), 1.0) else ab[1] if _near(R.scalar(ab[0]), 1.0) else None
    erf = R.producer(e, "Erf")
    if erf is None or R.only_use(e, outputs) is not n:
        return None
    inner = erf.inputs[0]
    div = inner.producer if inner is not None else None
    if div is None or R.only_use(inner, outputs) is not erf:
        return None
    ops = _operands(div, div.op_type)
    if div.op_type == "Div" and ops and _near(R.scalar(ops[1]), math.sqrt(2)):
        x = ops[0]
    elif div.op_type == "Mul" and ops and _near(R.scalar(ops[1]), 1 / math.sqrt(2)):
        x = ops[0]
    elif div.op_type == "Mul" and ops and _near(R.scalar(ops[0]), 1 / math.sqrt(2)):
        x = ops[1]
    else:
        return None
    return x, [div, erf, n]


def _match(last: Node, outputs: set[int]):  # noqa: ANN202
    ab = _operands(last, "Mul")
    if ab is None:
        return None
    for half, other in ((ab[1], ab[0]), (ab[0], ab[1])):
        inner = R.producer(other, "Mul")
        if inner is None or R.only_use(other, outputs) is not last:
            continue
        p, q = inner.inputs
        if _near(R.scalar(half), 0.5):       # (x * (erf + 1)) * 0.5
            for xv, s in ((p, q), (q, p)):
                m = _scaled(s.producer, outputs) if s is not None and s.producer else None
                if m and m[0] is xv and R.only_use(s, outputs) is inner and R.is_float32(xv):
                    return xv, m[1] + [inner, last]
        # (x * 0.5) * (erf + 1): `other` is x * 0.5, `half` is the erf term
        for xv, s in ((p, q), (q, p)):
            if _near(R.scalar(s), 0.5) and half is not None and half.producer is not None:
                m = _scaled(half.producer, outputs)
                if m and m[0] is xv and R.only_use(half, outputs) is last and R.is_float32(xv):
                    return xv, m[1] + [inner, last]
    return None
