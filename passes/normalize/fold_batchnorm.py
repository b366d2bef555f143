"""Fold inference BatchNormalization into the Conv, ConvTranspose or Gemm before it."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Model

from .. import _rewrite as R
from .._infra import REWRITES, Pass, PassContext, PassResult


class FoldBatchNormPass(Pass):
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

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        folded = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            names = None
            dead = []
            for bn in g.nodes:
                if bn.op_type != "BatchNormalization" or not bn.is_onnx() or len(bn.inputs) < 5:
                    continue
                if bn.attributes.get("training_mode") is not None and bn.attributes["training_mode"].value:
                    continue
                if any(o.uses or id(o) in outputs for o in bn.outputs[1:]):
                    continue
                x = bn.inputs[0]
                p = x.producer if x is not None else None
                if p is None or p.op_type not in ("Conv", "ConvTranspose", "Gemm") or not p.is_onnx():
                    continue
                if R.only_use(x, outputs) is not bn:
                    continue
                gamma, beta, mean, var = (R.const(v) for v in bn.inputs[1:5])
                w = R.const(p.inputs[1])
                if any(a is None or a.dtype != np.float32 for a in (gamma, beta, mean, var, w)):
                    continue
                eps = bn.attributes["epsilon"].value if "epsilon" in bn.attributes else 1e-5
                s = (gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps))
                bias_in = p.inputs[2] if len(p.inputs) > 2 else None
                b = R.const(bias_in) if bias_in is not None else None
                if bias_in is not None and (b is None or b.dtype != np.float32):
                    continue
                new_w = _scaled_weight(p, w, s)
                if new_w is None:
                    continue
                channels = s.shape[0]
                if b is None:
                    b = np.zeros(channels, np.float32)
                elif b.size == channels:
                    b = b.reshape(channels)
                elif b.size == 1:
                    b = np.full(channels, b.reshape(-1)[0], np.float32)
                else:
                    continue
                new_b = ((b.astype(np.float64) - mean) * s + beta).astype(np.float32)
                names = names or R.value_names(g)
                base = p.inputs[1].name
                p.set_input(1, R.new_constant(g, names, f"{base}_bn", new_w.astype(np.float32)))
                R.set_bias(p, R.new_constant(g, names, f"{base}_bn_bias", new_b))
                R.hand_over_output(bn, p)   # the producer now makes the BN's output
                dead.append(bn)
                folded += 1
            g.remove_nodes(dead)
        return PassResult(model, folded > 0, {"batchnorms_folded": folded})


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
