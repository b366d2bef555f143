"""Merge chains of clamping ops (Relu, Min/Max by a constant, Clip) into one Clip or Relu."""

from __future__ import annotations

import math

import numpy as np

from mcp_compiler.ir import Attribute, AttrType, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES
from .._rules import FnRule, RewriteContext, RuleSetPass


def _merge(n: Node, rc: RewriteContext):  # noqa: ANN202
    """(x, lo, hi, chain): n and the clamps before it that feed only the next one (as far up as
    they go with intervals that meet), from x; else why not."""
    c = _clamp(n)
    if c is None:
        return "not a clamp of a float32 x by constants"
    x, lo, hi = c
    chain = [n]
    while True:
        inner = x.producer
        prev = _clamp(inner) if inner is not None else None
        if prev is None or rc.only_use(x) is not chain[0] or max(prev[1], lo) > min(prev[2], hi):
            break
        chain.insert(0, inner)
        x, lo, hi = prev[0], max(prev[1], lo), min(prev[2], hi)
    if len(chain) == 1:
        return "its input is not clamped by another Relu, Clip, Min or Max used only here (with an interval that meets)"
    return x, lo, hi, chain


def _merged(n: Node, found, rc: RewriteContext) -> None:  # noqa: ANN001
    x, lo, hi, chain = found
    y = n.outputs[0]
    rc.free(chain)
    rc.replace(chain, [_clip_node(rc, x, y, lo, hi, n.name or y.name)])


class FuseClipPass(RuleSetPass):
    """Each of these clamps x to an interval [lo, hi]:

        Relu(x) = [0, inf]    Max(x, c) = [c, inf]    Min(x, c) = [-inf, c]    Clip(x, lo, hi)

    and clamping to [a, b] then to [c, d] is clamping to [max(a, c), min(b, d)] when that
    interval is not empty. Rule: a chain of two or more clamps (each intermediate used only by
    the next) -> Clip(x, lo, hi), or Relu(x) for [0, inf]; matched from its last clamp (the
    worklist starts from the outputs), so the whole chain is one rewrite. x float32; c and the Clip bounds constants with one element that add no dims
    to x. Exact: the same comparisons, no rounding (Min(Max(x, 0), 6) -> Clip(x, 0, 6);
    Relu(x) then Min(., 6) -> Clip(x, 0, 6)).
    """

    name = "fuse-clip"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES
    reverse = True
    rounds = ((FnRule("chains_merged", frozenset({"Relu", "Clip", "Min", "Max"}), _merge, _merged),),)


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


def _clip_node(rc: RewriteContext, x: Value, y: Value, lo: float, hi: float, name: str) -> Node:
    if lo == 0.0 and hi == math.inf:
        return Node("Relu", [x], [y], name=name)
    bounds = [(b, i) for b, i in ((lo, "min"), (hi, "max")) if math.isfinite(b)]
    if rc.model.onnx_opset < 11:   # bounds are attributes before opset 11
        return Node("Clip", [x], [y], name=name, attributes=[Attribute(k, AttrType.FLOAT, b) for b, k in bounds])
    ins: list[Value | None] = [x, None, None]
    for b, k in bounds:
        ins[1 if k == "min" else 2] = rc.constant(f"{name}_{k}", np.array(b, np.float32))
    while ins[-1] is None:
        ins.pop()
    return Node("Clip", ins, [y], name=name)
