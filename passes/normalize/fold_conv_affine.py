"""Fold per-channel constant Mul and Add after a Conv into its weight and bias."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Model, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES
from .._pattern import Match, Op, Var
from .._rules import RewriteContext, Rule, RuleSetPass

CONV = Op("Conv", Var("x"), Var("w"), name="conv", more_inputs=True)
SCALED, SHIFTED = Op("Mul", CONV, Var("c"), name="op"), Op("Add", CONV, Var("c"), name="op")


def _vector(m: Match) -> np.ndarray | None:
    """c as one float32 value per output channel, when W (and the bias) are float32 constants."""
    conv, cv, w = m.node("conv"), R.const(m["c"]), R.const(m["w"])
    bias = _bias(conv, w)
    if cv is None or w is None or bias is None or cv.dtype != np.float32 or w.dtype != np.float32:
        return None
    return R.channel_vector(cv, w.shape[0], w.ndim)


def _bias(conv: Node, w: np.ndarray | None) -> np.ndarray | None:
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        return R.const(conv.inputs[2])
    return np.zeros(w.shape[0] if w is not None else 0, np.float32)


def _check(m: Match, model: Model) -> str | None:
    if _vector(m) is None:
        return "W, the bias or c is not a float32 constant, or c is not one value per output channel"
    y, conv_out = m.node("op").outputs[0], m.node("conv").outputs[0]
    if y.type is not None and conv_out.type is not None and y.type != conv_out.type:
        return "c would broadcast the Conv's output to another shape"
    return None


def _fold(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    conv, vec, w = m.node("conv"), _vector(m), R.const(m["w"])
    bias = _bias(conv, w).reshape(-1)
    base = m["w"].name
    weight = m["w"]
    if m.node("op").op_type == "Mul":
        scaled = (w * vec.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        weight, bias = rc.constant(f"{base}_scaled", scaled), bias * vec
    else:
        bias = bias + vec
    b = rc.constant(f"{base}_bias", bias.astype(np.float32))
    return [Node("Conv", [m["x"], weight, b], [y], name=conv.name, attributes=list(conv.attributes.values()))]


class FoldConvAffinePass(RuleSetPass):
    """Rules (Conv weight and bias float32 constants, the Conv's output used only here, c a
    float32 constant of one value per output channel: shape (), [C,1,1] or [1,C,1,1]):

    - Mul(Conv(x, W, b), c) -> Conv(x, W * c[m], b * c)      (either operand order)
    - Add(Conv(x, W, b), c) -> Conv(x, W, b + c)

    Chains (Conv -> Mul -> Add, the usual exported batch norm) fold in one run. Values change
    by float32 rounding of the folded weights only (tests: rtol 1e-4, atol 1e-5).
    """

    name = "fold-conv-affine"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES
    # a chain (Conv -> Mul -> Add) folds one link per sweep: sweep until nothing fires
    rounds = ((Rule("nodes_folded", SCALED, _fold, _check), Rule("nodes_folded", SHIFTED, _fold, _check)),)
