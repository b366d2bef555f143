"""The fold-batchnorm pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import pytest
from _fusion_cases import _bn, _init, _ops, _run, _save, rng
from onnx import TensorProto as TP
from onnx import helper

from mcp_compiler.passes.normalize import (
    FoldBatchNormPass,
)


@pytest.mark.parametrize("bias", [True, False])
def test_fold_batchnorm_into_conv(tmp_path, bias):
    bn, inits = _bn("bn", "c", "y", 8)
    conv = helper.make_node("Conv", ["x", "w", "cb"] if bias else ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    inits += [_init("w", 8, 3, 3, 3)] + ([_init("cb", 8)] if bias else [])
    m = _save(tmp_path, [conv, bn], [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 6, 6])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [1, 8, 6, 6])], inits)
    model, r = _run(FoldBatchNormPass(), m, tmp_path, {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)})
    assert r.modified and _ops(model) == ["Conv"] and model.graph.nodes[0].outputs[0].name == "y"


def test_fold_batchnorm_into_conv_transpose_and_gemm(tmp_path):
    bn1, i1 = _bn("bn1", "ct", "h", 4)
    bn2, i2 = _bn("bn2", "gm", "y", 5)
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["ct"]), bn1,
             helper.make_node("Flatten", ["h"], ["f"]), helper.make_node("Gemm", ["f", "wg", "gb"], ["gm"], transB=1), bn2]
    inits = i1 + i2 + [_init("wt", 2, 4, 2, 2), _init("wg", 5, 4 * 5 * 5), _init("gb", 5)]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [3, 2, 4, 4])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [3, 5])], inits)
    model, r = _run(FoldBatchNormPass(), m, tmp_path, {"x": rng.standard_normal((3, 2, 4, 4)).astype(np.float32)})
    assert r.stats["batchnorms_folded"] == 2 and _ops(model) == ["ConvTranspose", "Flatten", "Gemm"]


def test_batchnorm_kept_when_conv_output_is_used_twice(tmp_path):
    bn, inits = _bn("bn", "c", "y", 4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), bn, helper.make_node("Relu", ["c"], ["z"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 2, 3, 3])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [1, 4, 3, 3]), helper.make_tensor_value_info("z", TP.FLOAT, [1, 4, 3, 3])],
              inits + [_init("w", 4, 2, 1, 1)])
    model, r = _run(FoldBatchNormPass(), m, tmp_path, {"x": rng.standard_normal((1, 2, 3, 3)).astype(np.float32)})
    assert not r.modified and "BatchNormalization" in _ops(model)
