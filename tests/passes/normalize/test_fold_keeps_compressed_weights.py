"""Constant folding never expands compressed weights: DequantizeLinear of int8 weights and a
Cast of float16 weights stay, and the model's weights are not bigger than the input's."""

from __future__ import annotations

import numpy as np
from _helpers import save_model
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler import CompileOptions, compile_model


def test_quantized_and_half_weights_stay_compressed(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("DequantizeLinear", ["w8", "s", "z"], ["w"]),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Cast", ["w16"], ["v"], to=TP.FLOAT),
             helper.make_node("MatMul", ["h", "v"], ["y"])]
    p = save_model(tmp_path, "q", nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 256])],
                   [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 64])],
                   [numpy_helper.from_array(rng.integers(-127, 127, (256, 128)).astype(np.int8), "w8"),
                    numpy_helper.from_array(np.array(0.01, np.float32), "s"),
                    numpy_helper.from_array(np.array(0, np.int8), "z"),
                    numpy_helper.from_array(rng.standard_normal((128, 64)).astype(np.float16), "w16")])
    r = compile_model(p, tmp_path / "out.onnx", CompileOptions(checks=CompileOptions().checks))
    assert r.weight_bytes <= r.input_weight_bytes
    ops = [p["name"] for p in r.passes]
    assert "fold-constants" in ops
    import onnx

    out = onnx.load(tmp_path / "out.onnx")
    assert {n.op_type for n in out.graph.node} >= {"DequantizeLinear", "Cast"}
