"""The matmul-add-to-gemm pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
from _fusion_cases import _init, _ops, _run, _save, rng
from onnx import TensorProto as TP
from onnx import helper

from mcp_compiler.passes.normalize import (
    MatMulAddToGemmPass,
)


def test_matmul_add_to_gemm(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 8])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4])], [_init("w", 8, 4), _init("b", 4)])
    model, r = _run(MatMulAddToGemmPass(), m, tmp_path, {"x": rng.standard_normal((3, 8)).astype(np.float32)},
                    rtol=1e-6, atol=1e-6)
    assert r.modified and _ops(model) == ["Gemm"]


def test_matmul_add_3d_is_not_a_gemm(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3, 8])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3, 4])], [_init("w", 8, 4), _init("b", 4)])
    model, r = _run(MatMulAddToGemmPass(), m, tmp_path, {"x": rng.standard_normal((2, 3, 8)).astype(np.float32)})
    assert not r.modified
