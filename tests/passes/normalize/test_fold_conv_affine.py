"""The fold-conv-affine pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
from _fusion_cases import _init, _ops, _run, _save, rng
from onnx import TensorProto as TP
from onnx import helper

from mcp_compiler.passes.normalize import (
    FoldConvAffinePass,
)


def test_fold_conv_mul_add(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Mul", ["s", "c"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["y"])]
    inits = [_init("w", 6, 3, 1, 1), _init("b", 6), _init("s", 1, 6, 1, 1), _init("t", 6, 1, 1)]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 4, 4])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [1, 6, 4, 4])], inits)
    model, r = _run(FoldConvAffinePass(), m, tmp_path, {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32)})
    assert r.stats["nodes_folded"] == 2 and _ops(model) == ["Conv"]


def test_conv_mul_by_a_full_tensor_is_not_folded(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 4, 4])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [1, 6, 4, 4])],
              [_init("w", 6, 3, 1, 1), _init("s", 1, 6, 4, 4)])
    model, r = _run(FoldConvAffinePass(), m, tmp_path, {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32)})
    assert not r.modified
