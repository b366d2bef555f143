"""The inline-constant-if pass: PyTorch's squeeze-if-the-dim-is-1 If, its condition known once
the dim is, becomes the branch it takes; onnxruntime outputs stay equal."""

from __future__ import annotations

import numpy as np
import onnx
from _exact_cases import _ops, _same_outputs
from _helpers import save_model
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.options import PipelineOptions
from mcp_compiler.pipeline import build


def test_squeeze_if_becomes_a_squeeze(tmp_path):
    then_g = helper.make_graph([helper.make_node("Squeeze", ["x", "ax"], ["sq"])], "then", [],
                               [helper.make_tensor_value_info("sq", TP.FLOAT, ["N", 8])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["id"])], "else", [],
                               [helper.make_tensor_value_info("id", TP.FLOAT, ["N", 1, 8])])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["d"], axis=0),
             helper.make_node("Equal", ["d", "one"], ["c"]),
             helper.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["r"], ["y"])]
    path = save_model(tmp_path, "m", nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 1, 8])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 8])],
                      [numpy_helper.from_array(np.array(1, np.int64), "one"),
                       numpy_helper.from_array(np.array([1], np.int64), "ax")], opset=13)
    original, model = onnx.load(path), load_onnx(path).model
    _, records = build(options=PipelineOptions(passes=["fold-shape-values", "fold-constants", "inline-constant-if",
                                                       "dead-code-elimination"])).run(model)
    assert next(r for r in records if r.name == "inline-constant-if").stats["ifs_inlined"] == 1
    assert _ops(model) == ["Squeeze", "Relu"]
    _same_outputs(original, model, {"x": np.random.default_rng(0).standard_normal((3, 1, 8)).astype(np.float32)})
