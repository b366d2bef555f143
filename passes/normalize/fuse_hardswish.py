"""Fuse the exported hard-swish / hard-sigmoid arithmetic into HardSwish or HardSigmoid."""

from __future__ import annotations

from mcp_compiler.ir import Attribute, AttrType, Model, Node, Value

from .. import _rewrite as R
from .._infra import Pass, PassContext, PassResult


class FuseHardSwishPass(Pass):
    """Rules (x float32; the constants scalars; intermediate values used only in the pattern):

    - Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) -> HardSwish(x)              (opset >= 14)
    -                                       -> Mul(x, HardSigmoid(x, 1/6, 0.5))   (older opsets)
    - Div(Clip(Add(x, 3), 0, 6), 6) -> HardSigmoid(x, alpha=1/6, beta=0.5)
    Mul by 1/6 instead of Div by 6, and either operand order of Add/Mul, match too.
    HardSigmoid computes max(0, min(1, x/6 + 0.5)): the same function, rounded differently in
    the last bit (tests: rtol 1e-5, atol 1e-6).
    """

    name = "fuse-hardswish"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        fused = {"hardswish": 0, "hardsigmoid": 0}
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            splice = R.Splice(g)
            for div in g.nodes:
                m = _match(div, outputs)
                if m is None or splice.taken(m[2]):
                    continue
                x, inner, nodes, swish = m
                y = div.outputs[0]
                splice.free(nodes)
                hs = [Attribute("alpha", AttrType.FLOAT, 1 / 6), Attribute("beta", AttrType.FLOAT, 0.5)]
                if not swish:
                    new = [Node("HardSigmoid", [x], [y], name=div.name or y.name, attributes=hs)]
                    fused["hardsigmoid"] += 1
                elif opset >= 14:
                    new = [Node("HardSwish", [x], [y], name=div.name or y.name)]
                    fused["hardswish"] += 1
                else:
                    sig = Value(f"{y.name}__hardsigmoid", inner.type)
                    new = [Node("HardSigmoid", [x], [sig], name=f"{div.name or y.name}_hardsigmoid", attributes=hs),
                           Node("Mul", [x, sig], [y], name=div.name or y.name)]
                    fused["hardswish"] += 1
                splice.replace(nodes, new)
            splice.apply()
        return PassResult(model, any(fused.values()), fused)


def _match(div: Node, outputs: set[int]):  # noqa: ANN202
    """(x, the Clip output, the pattern's nodes, is hard-swish) when `div` ends the pattern."""
    if div.domain not in ("", "ai.onnx") or len(div.inputs) != 2:
        return None
    if div.op_type == "Div" and R.scalar(div.inputs[1]) == 6.0:
        top = div.inputs[0]
    elif div.op_type == "Mul" and _is_sixth(R.scalar(div.inputs[1])):
        top = div.inputs[0]
    elif div.op_type == "Mul" and _is_sixth(R.scalar(div.inputs[0])):
        top = div.inputs[1]
    else:
        return None
    if R.only_use(top, outputs) is not div:
        return None
    mul = R.producer(top, "Mul")
    clip = R.producer(top, "Clip")
    swish = False
    x_outer = None
    if mul is not None:
        a, b = mul.inputs
        clip = R.producer(b, "Clip") or R.producer(a, "Clip")
        if clip is None:
            return None
        x_outer = a if clip.outputs[0] is b else b
        if R.only_use(clip.outputs[0], outputs) is not mul:
            return None
        swish = True
    if clip is None or len(clip.inputs) != 3 or R.scalar(clip.inputs[1]) != 0.0 or R.scalar(clip.inputs[2]) != 6.0:
        return None
    add = R.producer(clip.inputs[0], "Add")
    if add is None or R.only_use(add.outputs[0], outputs) is not clip:
        return None
    a, b = add.inputs
    if R.scalar(b) == 3.0:
        x = a
    elif R.scalar(a) == 3.0:
        x = b
    else:
        return None
    if not R.is_float32(x) or (swish and x_outer is not x):
        return None
    nodes = [add, clip] + ([mul] if swish else []) + [div]
    return x, clip.outputs[0], nodes, swish


def _is_sixth(v: float | None) -> bool:
    return v is not None and abs(v - 1 / 6) < 1e-7
