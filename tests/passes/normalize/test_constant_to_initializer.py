"""The constant-to-initializer pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
from _exact_cases import F, X, _load, _ops, _run, _same_outputs
from onnx import TensorProto, helper, numpy_helper

from mcp_compiler.passes.normalize import (
    ConstantToInitializerPass,
)


def test_constant_to_initializer(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones((2, 3), np.float32))),
         helper.make_node("Constant", [], ["k"], value_float=2.0),
         helper.make_node("Constant", [], ["ints"], value_ints=[1, 2]),
         helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Mul", ["a", "k"], ["y"]),
         helper.make_node("Shape", ["ints"], ["s"])],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3]), helper.make_tensor_value_info("s", TensorProto.INT64, [1])])
    orig, model = _load(tmp_path, g)
    r = _run(ConstantToInitializerPass(), model)
    assert r.modified and r.stats["constants_moved"] == 3
    assert _ops(model) == ["Add", "Mul", "Shape"]
    assert model.graph.initializers["k"].const.dtype.name == "FLOAT"
    assert model.graph.initializers["ints"].const.numpy().tolist() == [1, 2]
    _same_outputs(orig, model, {"x": X})
    assert not _run(ConstantToInitializerPass(), model).modified  # nothing left: says so


def test_constant_to_initializer_keeps_graph_outputs_and_old_ir(tmp_path):
    g = helper.make_graph([helper.make_node("Constant", [], ["y"], value_float=1.0)], "g", [],
                          [helper.make_tensor_value_info("y", F, [])])
    _, model = _load(tmp_path, g)
    assert not _run(ConstantToInitializerPass(), model).modified
    one = numpy_helper.from_array(np.array(1.0, np.float32))
    g = helper.make_graph([helper.make_node("Constant", [], ["c"], value=one),
                           helper.make_node("Neg", ["c"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", F, [])])
    # an IR 3 model is read as IR 4 (its initializers are not inputs a caller may feed): it moves too
    _, model = _load(tmp_path, g, opset=9, ir_version=3)
    assert model.ir_version == 4
    r = _run(ConstantToInitializerPass(), model)
    assert r.modified and r.stats == {"constants_moved": 1}
    model.ir_version = 3   # built in memory as IR 3: initializers would have to be inputs
    assert _run(ConstantToInitializerPass(), model).stats == {"skipped_ir_version_below_4": 1}
