"""The simplify-softmax pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import pytest
from _fusion_cases import _ops, _run, _save, rng
from onnx import TensorProto as TP
from onnx import helper, numpy_helper


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_simplify_softmax_undoes_the_version_converters_coercion(tmp_path, op):
    from mcp_compiler.passes.normalize import SimplifySoftmaxPass

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Flatten", ["x"], ["f"], axis=2),
             helper.make_node(op, ["f"], ["o"], axis=1), helper.make_node("Reshape", ["o", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 7])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4, 7])], [], opset=13)
    model, r = _run(SimplifySoftmaxPass(), m, tmp_path, {"x": rng.standard_normal((3, 4, 7)).astype(np.float32)},
                    rtol=1e-6, atol=1e-7)
    assert r.stats["simplified"] == 1 and _ops(model) == [op]


def test_simplify_softmax_keeps_a_flatten_before_the_last_axis(tmp_path):
    # Flatten(axis=1) of a rank-3 x: the softmax runs over axes 1 and 2 together
    from mcp_compiler.passes.normalize import SimplifySoftmaxPass

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Flatten", ["x"], ["f"], axis=1),
             helper.make_node("Softmax", ["f"], ["o"], axis=1), helper.make_node("Reshape", ["o", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 7])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4, 7])], [], opset=13)
    model, r = _run(SimplifySoftmaxPass(), m, tmp_path, {"x": rng.standard_normal((3, 4, 7)).astype(np.float32)})
    assert not r.modified and len(model.graph.nodes) == 4


def test_simplify_softmax_with_a_constant_shape_and_trailing_ones(tmp_path):
    # what the converter leaves for squeezenet's [1, 1000, 1, 1] scores: Flatten at the
    # default axis 1, the Reshape target a constant (the Shape folded)
    from mcp_compiler.passes.normalize import SimplifySoftmaxPass

    nodes = [helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("Softmax", ["f"], ["o"]),
             helper.make_node("Reshape", ["o", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 10, 1, 1])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 10, 1, 1])],
              [numpy_helper.from_array(np.array([2, 10, 1, 1], np.int64), "s")], opset=13)
    model, r = _run(SimplifySoftmaxPass(), m, tmp_path, {"x": rng.standard_normal((2, 10, 1, 1)).astype(np.float32)},
                    rtol=1e-6, atol=1e-7)
    assert r.stats["simplified"] == 1 and _ops(model) == ["Softmax"]
    assert model.graph.nodes[0].attributes["axis"].value == 1


def test_simplify_softmax_keeps_a_reshape_to_another_shape(tmp_path):
    from mcp_compiler.passes.normalize import SimplifySoftmaxPass

    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1), helper.make_node("Softmax", ["f"], ["o"], axis=1),
             helper.make_node("Reshape", ["o", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 10])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [5, 4])],
              [numpy_helper.from_array(np.array([5, 4], np.int64), "s")], opset=13)
    model, r = _run(SimplifySoftmaxPass(), m, tmp_path, {"x": rng.standard_normal((2, 10)).astype(np.float32)})
    assert not r.modified and len(model.graph.nodes) == 3
