"""The simplify-reshape pass (and --fold-size-limit, which decides what its constant shapes fold
into): structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
from _fusion_cases import _ops, _run, _save, rng
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.passes.normalize import (
    SimplifyReshapePass,
)


def test_reshape_from_own_shape_becomes_constant(tmp_path):
    # Reshape(x, Concat(Cast(Slice(Cast(Shape(x), int32), 0, 1), int64), [200])) -> Reshape(x, [0, 200])
    c = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["s32"], to=TP.INT32),
             helper.make_node("Slice", ["s32", "zero", "one", "zero", "one"], ["b32"]),
             helper.make_node("Cast", ["b32"], ["b"], to=TP.INT64),
             helper.make_node("Concat", ["b", "c200"], ["shape"], axis=0), helper.make_node("Reshape", ["x", "shape"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 200, 1, 1])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 200])],
              [c("zero", [0]), c("one", [1]), c("c200", [200])])
    model, r = _run(SimplifyReshapePass(), m, tmp_path, {"x": rng.standard_normal((3, 200, 1, 1)).astype(np.float32)},
                    rtol=0, atol=0)
    assert r.stats["shapes_made_constant"] == 1 and _ops(model) == ["Reshape"]
    assert list(model.graph.nodes[0].inputs[1].const.numpy()) == [0, 200]


def test_reshape_to_the_same_static_shape_goes(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 6])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 6])],
              [numpy_helper.from_array(np.array([0, -1], np.int64), "shape")])
    model, r = _run(SimplifyReshapePass(), m, tmp_path, {"x": rng.standard_normal((2, 6)).astype(np.float32)},
                    rtol=0, atol=0)
    assert r.stats["reshapes_removed"] == 1 and _ops(model) == ["Relu"]


def test_fold_size_limit_flag_materializes_generated_weights(tmp_path):
    # ConstantOfShape makes a 4 MB weight: kept as a node by default, folded with a larger limit
    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"], value=numpy_helper.from_array(np.array([0.01], np.float32))),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 1024])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 1024])],
              [numpy_helper.from_array(np.array([1024, 1024], np.int64), "shape")])
    runner = CliRunner()
    counts = []
    for extra in ([], ["--fold-size-limit", "8"]):
        r = runner.invoke(app, ["convert", "-i", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.mcpir"), "--json",
                                "--passes", "fold-constants,dead-code-elimination", "--force", *extra])
        assert r.exit_code == 0, r.output
        import json

        counts.append(json.loads(r.output)["nodes"])
    assert counts == [2, 1]
    r = runner.invoke(app, ["convert", "-i", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.mcpir"),
                            "--fold-size-limit", "-1"])
    assert r.exit_code == 2 and "--fold-size-limit must be >= 0" in r.output
    del m
