"""The optimize-transposes pass: transposes move down through elementwise ops and cancel where
they meet; onnxruntime outputs stay equal to the original's."""

from __future__ import annotations

import numpy as np
import onnx
from _exact_cases import _ops, _run, _same_outputs
from _helpers import save_model
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.normalize import DeadCodeEliminationPass, IdentityEliminationPass, OptimizeTransposesPass

NHWC, NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _t(x, y, perm):
    return helper.make_node("Transpose", [x], [y], perm=perm)


def test_tf2onnx_style_pairs_cancel(tmp_path):
    """Conv output to NHWC, Relu, a residual Add of another NHWC branch, Sigmoid, back to NCHW:
    every transpose meets its inverse."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             _t("c", "c_t", NHWC), helper.make_node("Relu", ["c_t"], ["r"]),
             _t("x", "x_t", NHWC), helper.make_node("Add", ["r", "x_t"], ["s"]),
             helper.make_node("Mul", ["s", "half"], ["h"]),
             helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("Sigmoid", ["hb"], ["g"]), _t("g", "y", NCHW)]
    path = save_model(tmp_path, "m", nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 8, 8])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4, 8, 8])],
                      [numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w"),
                       numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                       numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias")])
    original, model = onnx.load(path), load_onnx(path).model
    r = _run(OptimizeTransposesPass(), model)
    IdentityEliminationPass().run(model, PassContext())   # the identity transpose left on the output
    DeadCodeEliminationPass().run(model, PassContext())
    assert r.modified and "Transpose" not in _ops(model), _ops(model)
    # the Add of the two NHWC branches moves one transpose below it for both (a move), the last meets NCHW (a merge)
    assert r.stats["moved"] >= 5 and r.stats["merged"] == 1
    _same_outputs(original, model, {"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)}, rtol=1e-6, atol=1e-6)


def test_consecutive_transposes_merge_and_shared_constants_block(tmp_path):
    rng = np.random.default_rng(1)
    c = numpy_helper.from_array(rng.standard_normal((1, 8, 8, 4)).astype(np.float32), "c")
    nodes = [_t("x", "a", [0, 2, 3, 1]), _t("a", "b", [0, 2, 1, 3]),     # merge into one
             _t("x", "p", NHWC), helper.make_node("Add", ["p", "c"], ["q"]),   # c is shared: stays
             helper.make_node("Mul", ["c", "c"], ["cc"]), helper.make_node("Add", ["q", "cc"], ["z"])]
    path = save_model(tmp_path, "m", nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 4, 8, 8])],
                      [helper.make_tensor_value_info("b", TP.FLOAT, [1, 8, 8, 4]), helper.make_tensor_value_info("z", TP.FLOAT, [1, 8, 8, 4])],
                      [c])
    original, model = onnx.load(path), load_onnx(path).model
    weights = sum(v.const.nbytes for v in model.graph.initializers.values())
    r = _run(OptimizeTransposesPass(), model)
    assert r.stats["merged"] == 1 and _ops(model).count("Transpose") == 2
    assert sum(v.const.nbytes for v in model.graph.initializers.values()) == weights   # never grows
    _same_outputs(original, model, {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)})
