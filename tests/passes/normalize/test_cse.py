"""The common-subexpression-elimination pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
from _exact_cases import F, X, _load, _ops, _run, _same_outputs
from onnx import helper, numpy_helper

from mcp_compiler.passes.normalize import (
    CommonSubexpressionEliminationPass,
    DeadCodeEliminationPass,
)


def test_cse_and_dce(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["y"]),
         helper.make_node("Sigmoid", ["x"], ["dead1"]), helper.make_node("Neg", ["dead1"], ["dead2"]),
         helper.make_node("RandomUniformLike", ["x"], ["r1"]), helper.make_node("RandomUniformLike", ["x"], ["r2"])],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])],
        [numpy_helper.from_array(np.zeros(3, np.float32), "unused")])
    orig, model = _load(tmp_path, g)
    r = _run(CommonSubexpressionEliminationPass(), model)
    assert r.stats["nodes_merged"] == 1  # the two Relus; random ops never merge
    r = _run(DeadCodeEliminationPass(), model)
    assert r.stats == {"nodes_removed": 4, "initializers_removed": 1}
    assert _ops(model) == ["Relu", "Add"] and "unused" not in model.graph.initializers
    _same_outputs(orig, model, {"x": X})
    assert not _run(DeadCodeEliminationPass(), model).modified
