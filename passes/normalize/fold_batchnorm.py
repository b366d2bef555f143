"""Fold inference BatchNormalization into the Conv, ConvTranspose or Gemm before it."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Model, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES
from .._pattern import Match, Op, Or, Var
from .._rules import RewriteContext, Rule, RuleSetPass

_PRODUCER = Or(*(Op(op, Var("x"), Var("w"), name="p", more_inputs=True) for op in ("Conv", "ConvTranspose", "Gemm")))
BN = Op("BatchNormalization", _PRODUCER, Var("gamma"), Var("beta"), Var("mean"), Var("var"), name="bn")


def _params(m: Match) -> tuple | None:
    """(W scaled, the folded bias) as float32, or None when the rule cannot fold this site."""
    p, bn = m.node("p"), m.node("bn")
    gamma, beta, mean, var, w = (R.const(m[k]) for k in ("gamma", "beta", "mean", "var", "w"))
    if any(a is None or a.dtype != np.float32 for a in (gamma, beta, mean, var, w)):
        return None
    eps = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
    s = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    bias_in = p.inputs[2] if len(p.inputs) > 2 else None
    b = R.const(bias_in) if bias_in is not None else np.zeros(s.shape[0], np.float32)
    new_w = _scaled_weight(p, w, s)
    if b is None or b.dtype != np.float32 or new_w is None or b.size not in (1, s.shape[0]):
        return None
    b = np.broadcast_to(b.reshape(-1), s.shape)
    return new_w.astype(np.float32), ((b.astype(np.float64) - mean) * s + beta).astype(np.float32)


def _check(m: Match, model: Model) -> str | None:
    bn = m.node("bn")
    if "training_mode" in bn.attributes and bn.attributes["training_mode"].value:
        return "the BatchNormalization is in training mode"
    if any(o.uses for o in bn.outputs[1:]):
        return "its running mean/variance outputs are used"
    return None if _params(m) is not None else \
        "a parameter is not a float32 constant, or the weight's channels do not match (grouped ConvTranspose)"


def _fold(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    p = m.node("p")
    new_w, new_b = _params(m)
    base = m["w"].name
    w = rc.constant(f"{base}_bn", new_w)
    b = rc.constant(f"{base}_bn_bias", new_b)
    return [Node(p.op_type, [m["x"], w, b], [y], name=p.name, attributes=list(p.attributes.values()))]


class FoldBatchNormPass(RuleSetPass):
    """Rules (all parameters float32 constants, the producer's output used only by the BN, the BN
    in inference mode with its mean/var outputs unused):

    - BN(Conv(x, W, b)) -> Conv(x, W * s[m], (b - mean) * s + beta), s = gamma / sqrt(var + eps),
      m the output channel (axis 0 of W)
    - BN(ConvTranspose(x, W, b)) -> the same on axis 1 of W (group = 1)
    - BN(Gemm(A, B, C)) on [M, N] -> Gemm with B's output columns and C scaled the same way

    Values change by float32 rounding of the folded weights only (tests: rtol 1e-4, atol 1e-5).
    """

    name = "fold-batchnorm"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES
    rounds = ((Rule("batchnorms_folded", BN, _fold, _check),),)


def _scaled_weight(p, w: np.ndarray, s: np.ndarray) -> np.ndarray | None:  # noqa: ANN001
    if p.op_type == "Conv":
        if w.shape[0] != s.shape[0]:
            return None
        return w * s.reshape(-1, *([1] * (w.ndim - 1)))
    if p.op_type == "ConvTranspose":
        group = p.attributes["group"].value if "group" in p.attributes else 1
        if group != 1 or w.shape[1] != s.shape[0]:
            return None
        return w * s.reshape(1, -1, *([1] * (w.ndim - 2)))
    # Gemm: output [M, N]; B is [K, N], or [N, K] with transB
    trans_b = "transB" in p.attributes and p.attributes["transB"].value
    n = w.shape[0] if trans_b else w.shape[1]
    if w.ndim != 2 or n != s.shape[0]:
        return None
    beta = p.attributes["beta"].value if "beta" in p.attributes else 1.0
    if beta != 1.0 and len(p.inputs) > 2 and p.inputs[2] is not None:
        return None   # C scaled by beta: fold only the plain case
    return w * (s.reshape(-1, 1) if trans_b else s.reshape(1, -1))
