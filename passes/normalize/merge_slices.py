"""Consecutive Slices over different axes are one Slice."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Model, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES
from .._pattern import Match, Op, Var
from .._rules import RewriteContext, Rule, RuleSetPass

CHAIN = Op("Slice", Op("Slice", Var("x"), name="inner", more_inputs=True), name="outer", more_inputs=True)


def _params(n: Node) -> tuple[np.ndarray, ...] | None:
    """(starts, ends, axes, steps) of an opset-10+ Slice whose parameters are constants."""
    ins = [*n.inputs, None, None][1:5]
    arrays = [R.const(v) for v in ins]
    if any(v is not None and a is None for v, a in zip(ins, arrays)) or arrays[0] is None:
        return None
    starts, ends, axes, steps = (np.ravel(a).astype(np.int64) if a is not None else None for a in arrays)
    axes = np.arange(len(starts), dtype=np.int64) if axes is None else axes
    steps = np.ones(len(starts), dtype=np.int64) if steps is None else steps
    return starts, ends, axes, steps


def _rank(v: Value) -> int | None:
    shape = getattr(v.type, "shape", None)
    return len(shape) if shape is not None else None


def _check(m: Match, model: Model) -> str | None:
    inner, outer = _params(m.node("inner")), _params(m.node("outer"))
    if inner is None or outer is None:
        return "a Slice's starts, ends, axes or steps are not constants"
    rank = _rank(m["x"])
    if (inner[2] < 0).any() or (outer[2] < 0).any():
        if rank is None:
            return "negative axes and x's rank is unknown"
    a, b = (set(((p[2] + rank) % rank if rank else p[2]).tolist()) for p in (inner, outer))
    return None if not a & b else "both Slices cut the same axis"


def _one_slice(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    inner, outer = _params(m.node("inner")), _params(m.node("outer"))
    base = m.node("outer").name or y.name
    params = [rc.constant(f"{base}_{what}", np.concatenate([inner[k], outer[k]]))
              for k, what in enumerate(("starts", "ends", "axes", "steps"))]
    return [Node("Slice", [m["x"], *params], [y], name=m.node("outer").name)]


class MergeSlicesPass(RuleSetPass):
    """Rule: Slice(Slice(x, s1, e1, a1, p1), s2, e2, a2, p2) -> Slice(x, s1+s2, e1+e2, a1+a2,
    p1+p2) (lists joined) when both Slices' parameters are constants and they cut different axes:
    slicing one axis does not move another. Exact. (PyTorch writes `x[:, :129, 1:]` so.)
    """

    name = "merge-slices"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES
    rounds = ((Rule("slices_merged", CHAIN, _one_slice, _check, min_opset=10),),)
