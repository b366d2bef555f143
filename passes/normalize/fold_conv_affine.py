"""Fold per-channel constant Mul and Add after a Conv into its weight and bias."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Model

from .. import _rewrite as R
from .._infra import REWRITES, Pass, PassContext, PassResult


class FoldConvAffinePass(Pass):
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

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        folded = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            names = None
            dead = []
            for n in g.nodes:
                if n.op_type not in ("Mul", "Add") or not n.is_onnx() or len(n.inputs) != 2:
                    continue
                a, b = n.inputs
                conv_out, c = (a, b) if R.producer(a, "Conv") is not None else (b, a)
                conv = R.producer(conv_out, "Conv")
                if conv is None or R.only_use(conv_out, outputs) is not n or conv.outputs[0] is not conv_out:
                    continue
                cv = R.const(c)
                w = R.const(conv.inputs[1])
                bias_v = conv.inputs[2] if len(conv.inputs) > 2 else None
                bias = R.const(bias_v) if bias_v is not None else np.zeros(w.shape[0] if w is not None else 0, np.float32)
                if cv is None or w is None or bias is None or cv.dtype != np.float32 or w.dtype != np.float32:
                    continue
                m = w.shape[0]
                vec = R.channel_vector(cv, m, w.ndim)
                if vec is None or n.outputs[0].type is not None and conv_out.type is not None \
                        and n.outputs[0].type != conv_out.type:
                    continue   # the constant would broadcast the output to another shape
                names = names or R.value_names(g)
                base = conv.inputs[1].name
                if n.op_type == "Mul":
                    conv.set_input(1, R.new_constant(g, names, f"{base}_scaled",
                                                     (w * vec.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)))
                    new_bias = bias.reshape(-1) * vec
                else:
                    new_bias = bias.reshape(-1) + vec
                R.set_bias(conv, R.new_constant(g, names, f"{base}_bias", new_bias.astype(np.float32)))
                R.hand_over_output(n, conv)   # the Conv now makes the Mul/Add's output
                dead.append(n)
                folded += 1
            g.remove_nodes(dead)
        return PassResult(model, folded > 0, {"nodes_folded": folded})
