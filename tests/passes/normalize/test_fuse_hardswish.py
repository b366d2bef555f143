"""The fuse-hardswish pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import pytest
from _fusion_cases import _ops, _run, _save
from _helpers import ort_run
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.normalize import (
    DeadCodeEliminationPass,
    FuseHardSwishPass,
)


def _hardswish_nodes(div_by_six=True):
    c = lambda n, v: helper.make_node("Constant", [], [n], value=numpy_helper.from_array(np.array(v, np.float32)))  # noqa: E731
    last = (helper.make_node("Div", ["m", "six"], ["y"]) if div_by_six
            else helper.make_node("Mul", ["sixth", "m"], ["y"]))
    return [c("three", 3.0), c("zero", 0.0), c("six", 6.0), c("sixth", 1 / 6),
            helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["k"]),
            helper.make_node("Mul", ["x", "k"], ["m"]), last]


@pytest.mark.parametrize("opset,ops", [(14, ["HardSwish"]), (12, ["HardSigmoid", "Mul"])])
@pytest.mark.parametrize("div", [True, False])
def test_fuse_hardswish(tmp_path, opset, ops, div):
    from mcp_compiler.passes.normalize import ConstantToInitializerPass

    m = _save(tmp_path, _hardswish_nodes(div), [helper.make_tensor_value_info("x", TP.FLOAT, [2, 50])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 50])], [], opset=opset)
    model = load_onnx(tmp_path / "m.onnx").model
    ConstantToInitializerPass().run(model, PassContext())
    r = FuseHardSwishPass().run(model, PassContext())
    DeadCodeEliminationPass().run(model, PassContext())
    verify(model)
    assert r.stats["hardswish"] == 1 and _ops(model) == ops
    x = np.linspace(-5, 5, 100, dtype=np.float32).reshape(2, 50)
    np.testing.assert_allclose(ort_run(to_onnx(model), {"x": x})[0], ort_run(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["mul", "div"])
def test_fuse_affine_clip_into_hardsigmoid(tmp_path, form):
    c = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    first = (helper.make_node("Mul", ["x", "a"], ["m"]) if form == "mul" else helper.make_node("Div", ["x", "k"], ["m"]))
    nodes = [first, helper.make_node("Add", ["b", "m"], ["s"]), helper.make_node("Clip", ["s", "zero", "one"], ["y"])]
    inits = [c(0.2, "a"), c(5.0, "k"), c(0.5, "b"), c(0.0, "zero"), c(1.0, "one")]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 50])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 50])], inits, opset=13)
    x = {"x": np.linspace(-5, 5, 100, dtype=np.float32).reshape(2, 50)}
    model, r = _run(FuseHardSwishPass(), m, tmp_path, x, rtol=1e-5, atol=1e-6)
    assert r.stats["hardsigmoid_affine"] == 1 and _ops(model) == ["HardSigmoid"]
    assert abs(model.graph.nodes[0].attributes["alpha"].value - 0.2) < 1e-7


@pytest.mark.parametrize("opset,ops", [(14, ["HardSwish"]), (13, ["HardSigmoid", "Mul"])])
def test_x_times_hardsigmoid_becomes_hardswish(tmp_path, opset, ops):
    # what Paddle exports for hard_swish below opset 14 (PP-OCR det/rec/cls are full of it)
    nodes = [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5), helper.make_node("Mul", ["x", "h"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 50])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 50])], [], opset=opset)
    x = {"x": np.linspace(-5, 5, 100, dtype=np.float32).reshape(2, 50)}
    model, r = _run(FuseHardSwishPass(), m, tmp_path, x, rtol=1e-5, atol=1e-6)
    assert r.modified == (opset >= 14) and _ops(model) == ops


def test_hardsigmoid_with_other_constants_is_not_hardswish(tmp_path):
    nodes = [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=0.2, beta=0.5), helper.make_node("Mul", ["x", "h"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 50])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 50])], [], opset=14)
    model, r = _run(FuseHardSwishPass(), m, tmp_path, {"x": np.linspace(-5, 5, 100, dtype=np.float32).reshape(2, 50)})
    assert not r.modified and _ops(model) == ["HardSigmoid", "Mul"]
