"""The fuse-layernorm pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _fusion_cases import ATOL, RTOL, _init, _layernorm_nodes, _ops, _run, _save, rng
from _helpers import ort_run
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.normalize import (
    DeadCodeEliminationPass,
)


@pytest.mark.parametrize("opset,square,affine", [(17, "Pow", True), (18, "Mul", True), (17, "Pow", False)])
def test_fuse_layernorm(tmp_path, opset, square, affine):
    from mcp_compiler.passes.normalize import FuseLayerNormPass

    nodes, inits = _layernorm_nodes(opset, square, affine)
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 5, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 5, 16])], inits, opset=opset)
    feeds = {"x": rng.standard_normal((2, 5, 16)).astype(np.float32) * 3 + 1}
    model, r = _run(FuseLayerNormPass(), m, tmp_path, feeds)
    assert r.modified and r.stats["fired"] == 1 and _ops(model) == ["LayerNormalization"]


def test_layernorm_not_fused_below_opset_17(tmp_path):
    from mcp_compiler.passes.normalize import FuseLayerNormPass

    nodes, inits = _layernorm_nodes(13)
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 5, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 5, 16])], inits, opset=13)
    model, r = _run(FuseLayerNormPass(), m, tmp_path, {"x": rng.standard_normal((2, 5, 16)).astype(np.float32)})
    assert not r.modified and "opset 13" in r.stats["reason"] and len(model.graph.nodes) == 9


def test_layernorm_reciprocal_form_and_shapes_from_inference(tmp_path):
    # d * Reciprocal(Sqrt(...)), and x's shape unknown to ONNX (the Reshape target is computed):
    # the pipeline's infer-shapes gives x its static last dim first
    from mcp_compiler.passes.normalize import FuseLayerNormPass
    from mcp_compiler.passes.shapes import SymbolicShapesPass

    nodes, inits = _layernorm_nodes(17)
    nodes[6] = helper.make_node("Reciprocal", ["s"], ["rs"])
    nodes.insert(7, helper.make_node("Mul", ["d", "rs"], ["n"]))
    nodes = [helper.make_node("Shape", ["x0"], ["sh"]), helper.make_node("Reshape", ["x0", "sh"], ["x"])] + nodes
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x0", TP.FLOAT, ["N", 5, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 5, 16])], inits)
    model = load_onnx(tmp_path / "m.onnx").model
    x = next(n for n in model.graph.nodes if n.op_type == "Reshape").outputs[0]
    x.type = None   # what ONNX's inference leaves for a Reshape to a computed shape
    assert not FuseLayerNormPass().run(model, PassContext()).modified
    SymbolicShapesPass().run(model, PassContext())
    r = FuseLayerNormPass().run(model, PassContext())
    DeadCodeEliminationPass().run(model, PassContext())
    verify(model)
    assert r.stats["LayerNormalization"] == 1 and _ops(model)[-1] == "LayerNormalization"
    feeds = {"x0": rng.standard_normal((2, 5, 16)).astype(np.float32)}
    np.testing.assert_allclose(ort_run(to_onnx(model), feeds)[0], ort_run(m, feeds)[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("square,affine", [("Pow", True), ("Mul", False)])
def test_fuse_rmsnorm(tmp_path, square, affine):
    from mcp_compiler.passes.normalize import FuseLayerNormPass

    sq = (helper.make_node("Pow", ["x", "two"], ["p"]) if square == "Pow"
          else helper.make_node("Mul", ["x", "x"], ["p"]))
    nodes = [sq, helper.make_node("ReduceMean", ["p", "ax"], ["v"]), helper.make_node("Add", ["v", "eps"], ["e"]),
             helper.make_node("Sqrt", ["e"], ["s"]), helper.make_node("Reciprocal", ["s"], ["r"]),
             helper.make_node("Mul", ["x", "r"], ["n" if affine else "y"])]
    if affine:
        nodes.append(helper.make_node("Mul", ["gamma", "n"], ["y"]))
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"), numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             _init("gamma", 16), numpy_helper.from_array(np.array([-1], np.int64), "ax")]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 5, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 5, 16])], inits, opset=23)
    m.ir_version = 11
    onnx.save(m, tmp_path / "m.onnx")
    model, r = _run(FuseLayerNormPass(), m, tmp_path, {"x": rng.standard_normal((2, 5, 16)).astype(np.float32) * 2})
    assert r.stats["RMSNormalization"] == 1 and _ops(model) == ["RMSNormalization"]


def test_layernorm_not_fused_when_the_mean_is_not_over_the_last_axis(tmp_path):
    from mcp_compiler.passes.normalize import FuseLayerNormPass

    nodes, inits = _layernorm_nodes(17)
    for i in (0, 3):
        nodes[i] = helper.make_node("ReduceMean", list(nodes[i].input), list(nodes[i].output), axes=[1])
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 16, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 16, 16])], inits)
    model, r = _run(FuseLayerNormPass(), m, tmp_path, {"x": rng.standard_normal((2, 16, 16)).astype(np.float32)})
    assert not r.modified and "LayerNormalization" not in _ops(model)


@pytest.mark.parametrize("rsqrt", ["reciprocal", "pow"])
def test_tf2onnx_layernorm(tmp_path, rsqrt):
    """tf2onnx's keras LayerNormalization: s = gamma * Rsqrt(var + eps); y = x * s + (beta - mean * s)."""
    from mcp_compiler.passes.normalize import FuseLayerNormPass

    c = 16
    ax = numpy_helper.from_array(np.array([-1], np.int64), "ax")
    nodes = [helper.make_node("ReduceMean", ["x", "ax"], ["mean"], keepdims=1),
             helper.make_node("Sub", ["x", "mean"], ["d"]), helper.make_node("Mul", ["d", "d"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "ax"], ["var"], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"])]
    if rsqrt == "pow":
        nodes += [helper.make_node("Pow", ["ve", "mhalf"], ["r"])]
    else:
        nodes += [helper.make_node("Sqrt", ["ve"], ["sd"]), helper.make_node("Reciprocal", ["sd"], ["r"])]
    nodes += [helper.make_node("Mul", ["r", "gamma"], ["s"]), helper.make_node("Mul", ["x", "s"], ["xs"]),
              helper.make_node("Mul", ["mean", "s"], ["ms"]), helper.make_node("Sub", ["beta", "ms"], ["b2"]),
              helper.make_node("Add", ["xs", "b2"], ["y"])]
    f = lambda v, n: numpy_helper.from_array(np.asarray(v, np.float32), n)  # noqa: E731
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 7, c])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 7, c])],
              [ax, f(1e-3, "eps"), f(-0.5, "mhalf"), f(rng.standard_normal(c) + 1, "gamma"), f(rng.standard_normal(c), "beta")],
              opset=18)
    model, r = _run(FuseLayerNormPass(), m, tmp_path, {"x": rng.standard_normal((3, 7, c)).astype(np.float32)},
                    rtol=1e-4, atol=1e-5)
    assert r.modified and _ops(model) == ["LayerNormalization"]
