"""The dead-code-elimination pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
from _exact_cases import F, X, _load, _run, _same_outputs
from onnx import TensorProto, helper

from mcp_compiler.passes.normalize import (
    DeadCodeEliminationPass,
)


def test_dce_keeps_values_used_in_subgraphs(tmp_path):
    then_g = helper.make_graph([helper.make_node("Neg", ["outer"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [2, 3])])
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["outer"]), helper.make_node("If", ["cond"], ["y"],
                                                                     then_branch=then_g, else_branch=else_g)],
        "g", [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [2, 3])])
    orig, model = _load(tmp_path, g)
    assert not _run(DeadCodeEliminationPass(), model).modified
    for c in (True, False):
        _same_outputs(orig, model, {"x": X, "cond": np.array(c)})
