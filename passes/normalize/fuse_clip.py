"""Merge chains of clamping ops (Relu, Min/Max by a constant, Clip) into one Clip or Relu."""

from __future__ import annotations

import math

import numpy as np

from mcp_compiler.ir import Attribute, AttrType, Model, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES, Pass, PassContext, PassResult


class FuseClipPass(Pass):
    """Each of these clamps x to an interval [lo, hi]:

        Relu(x) = [0, inf]    Max(x, c) = [c, inf]    Min(x, c) = [-inf, c]    Clip(x, lo, hi)

    and clamping to [a, b] then to [c, d] is clamping to [max(a, c), min(b, d)] when that
    interval is not empty. Rule: a chain of two or more clamps (each intermediate used only by
    the next) -> Clip(x, lo, hi), or Relu(x) for [0, inf]. x float32; c and the Clip bounds
    constants with one element that add no dims to x. Exact: the same comparisons, no rounding
    (Min(Max(x, 0), 6) -> Clip(x, 0, 6); Relu(x) then Min(., 6) -> Clip(x, 0, 6)).
    """

    name = "fuse-clip"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opset = model.onnx_opset
        fused = removed = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            names = R.value_names(g)
            chains: dict[int, tuple[Value, float, float, list[Node]]] = {}   # by last node
            for n in g.nodes:
                c = _clamp(n)
                if c is None:
                    continue
                x, lo, hi = c
                p = x.producer
                prev = chains.get(id(p)) if p is not None and R.only_use(x, outputs) is n else None
                if prev is not None and max(prev[1], lo) <= min(prev[2], hi):
                    src, plo, phi, nodes = chains.pop(id(p))
                    chains[id(n)] = (src, max(plo, lo), min(phi, hi), nodes + [n])
                else:
                    chains[id(n)] = (x, lo, hi, [n])
            splice = R.Splice(g)
            for x, lo, hi, nodes in chains.values():
                if len(nodes) < 2:
                    continue
                y = nodes[-1].outputs[0]
                splice.free(nodes)
                splice.replace(nodes, [_clip_node(g, names, x, y, lo, hi, nodes[-1].name or y.name, opset)])
                removed += len(nodes) - 1
            fused += splice.apply()
        return PassResult(model, fused > 0, {"chains_merged": fused, "nodes_removed": removed})


def _clamp(n: Node) -> tuple[Value, float, float] | None:
    """(x, lo, hi) when n clamps a float32 x to [lo, hi] (lo <= hi), else None."""
    if not n.is_onnx() or len(n.outputs) != 1 or not n.inputs:
        return None
    x = n.inputs[0]
    if n.op_type in ("Relu", "Clip") and not R.is_float32(x):
        return None
    if n.op_type == "Relu" and len(n.inputs) == 1:
        return x, 0.0, math.inf
    if n.op_type == "Clip":
        b = R.clip_bounds(n)
        return (x, *b) if b is not None and b[0] <= b[1] else None
    if n.op_type in ("Min", "Max") and len(n.inputs) == 2:
        for v, c in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            a, k = R.const(c), R.scalar(c)
            if k is None or math.isnan(k) or a.ndim > len(R.shape(v) or ()) or not R.is_float32(v):
                continue
            return (v, -math.inf, k) if n.op_type == "Min" else (v, k, math.inf)
    return None


def _clip_node(g, names: set[str], x: Value, y: Value, lo: float, hi: float, name: str,  # noqa: ANN001
               opset: int) -> Node:
    if lo == 0.0 and hi == math.inf:
        return Node("Relu", [x], [y], name=name)
    bounds = [(b, i) for b, i in ((lo, "min"), (hi, "max")) if math.isfinite(b)]
    if opset < 11:   # bounds are attributes before opset 11
        return Node("Clip", [x], [y], name=name, attributes=[Attribute(k, AttrType.FLOAT, b) for b, k in bounds])
    ins: list[Value | None] = [x, None, None]
    for b, k in bounds:
        ins[1 if k == "min" else 2] = R.new_constant(g, names, f"{name}_{k}", np.array(b, np.float32))
    while ins[-1] is None:
        ins.pop()
    return Node("Clip", ins, [y], name=name)
