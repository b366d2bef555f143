"""The simplify-reshape pass (and --fold-size-limit, which decides what its constant shapes fold
into): structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import pytest
from _exact_cases import _load
from _fusion_cases import _ops, _run, _save, rng
from _helpers import ort_run
from onnx import TensorProto, helper, numpy_helper
from onnx import TensorProto as TP

from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
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


def test_a_shape_made_constant_is_not_reported_as_grown_weights(tmp_path):
    """Reshape(t, Shape(x)) with x's shape known: the target becomes a 16-byte int64 constant. The
    bytes of constants grow, by an operator's parameter (Tensor.is_parameter), not a weight: no warning."""
    import json

    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["t", "s"], ["y"])]
    _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3]), helper.make_tensor_value_info("t", TP.FLOAT, [3, 2])],
          [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3])], [])
    r = CliRunner().invoke(app, ["convert", "-i", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx"), "--json"])
    out = json.loads(r.output)
    assert r.exit_code == 0 and out["nodes"] == 1, r.output
    assert out["weight_bytes"] > out["input_weight_bytes"] and not any("weights grew" in w for w in out["warnings"])


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
    counts, grew = [], []
    for extra in ([], ["--fold-size-limit", "8"]):
        r = runner.invoke(app, ["convert", "-i", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.mcpir"), "--json",
                                "--passes", "fold-constants,dead-code-elimination", "--force", *extra])
        assert r.exit_code == 0, r.output
        import json

        counts.append(json.loads(r.output)["nodes"])
        grew.append(any("the weights grew" in w for w in json.loads(r.output)["warnings"]))
    assert counts == [2, 1] and grew == [False, True]   # the user is told the 4 MB weight was stored
    r = runner.invoke(app, ["convert", "-i", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.mcpir"),
                            "--fold-size-limit", "-1"])
    assert r.exit_code == 2 and "--fold-size-limit must be between 0" in r.output
    del m


@pytest.mark.parametrize("perm, target, merged, want", [
    ([0, 2, 1, 3], [80, 0, 768], True, [80, -1, 768]),   # DynamicQuantizeLSTM's [seq, 1, batch, hidden]
    ([0, 2, 1, 3], [0, 0, 0, 768], True, [80, -1, 1, 768]),
    ([0, 2, 1, 3], [0, 0, -1], False, None),               # batch and -1: two unknowns
    ([2, 0, 1, 3], [-1, 768], False, None),               # moves batch before seq: data moves
])
def test_reshape_of_a_transpose_of_unit_dims(tmp_path, perm, target, merged, want):
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Transpose", ["n"], ["t"], perm=perm),
                           helper.make_node("Reshape", ["t", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [80, 1, "batch", 768])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", "d"][:len(target)])],
                          [numpy_helper.from_array(np.array(target, np.int64), "s")])
    original, model = _load(tmp_path, g)
    SimplifyReshapePass().run(model, PassContext())
    ops = [n.op_type for n in model.graph.nodes]
    assert ops == (["Neg", "Reshape", "Relu"] if merged else ["Neg", "Transpose", "Reshape", "Relu"])
    if want is not None:
        assert model.graph.nodes[1].inputs[1].const.numpy().tolist() == want
    x = np.random.default_rng(0).standard_normal((80, 1, 3, 768)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(to_onnx(model), {"x": x})[0], ort_run(original, {"x": x})[0])


def test_reshape_of_a_reshape(tmp_path):
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Reshape", ["n", "a"], ["t"]),
                           helper.make_node("Reshape", ["t", "b"], ["r"]), helper.make_node("Relu", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
                          [numpy_helper.from_array(np.array([0, 2, 3], np.int64), "a"),
                           numpy_helper.from_array(np.array([-1, 3], np.int64), "b")])
    original, model = _load(tmp_path, g)
    SimplifyReshapePass().run(model, PassContext())
    assert [n.op_type for n in model.graph.nodes] == ["Neg", "Reshape", "Relu"]
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(ort_run(to_onnx(model), {"x": x})[0], ort_run(original, {"x": x})[0])
