"""Shared fixtures."""

from __future__ import annotations

import numpy as np
import onnx
import pytest


@pytest.fixture
def tiny_model() -> onnx.ModelProto:
    """y = relu(x @ W + b), x: [N, 4]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m
