"""Fusion passes (BN folding, Conv affine folding, hard-swish, MatMul+Add->Gemm, Reshape
simplification): structure after, and onnxruntime outputs equal to the original's within the
float32 rounding each pass states."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.normalize import (DeadCodeEliminationPass, FoldBatchNormPass, FoldConvAffinePass,
                                           FuseHardSwishPass, MatMulAddToGemmPass, SimplifyReshapePass)

from _helpers import ort_run

RTOL, ATOL = 1e-4, 1e-5   # folded weights are rounded to float32 once
rng = np.random.default_rng(0)


def _init(name, *shape, positive=False):
    a = rng.standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)


def _save(tmp_path, nodes, inputs, outputs, inits, opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    return m


def _run(p, m, tmp_path, feeds, rtol=RTOL, atol=ATOL):
    model = load_onnx(tmp_path / "m.onnx").model
    r = p.run(model, PassContext())
    DeadCodeEliminationPass().run(model, PassContext())
    verify(model)
    for a, b in zip(ort_run(m, feeds), ort_run(to_onnx(model), feeds)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)
    return model, r


def _ops(model):
    return [n.op_type for n in model.graph.nodes]


def _bn(name, x, y, c):
    return (helper.make_node("BatchNormalization", [x, f"{name}_g", f"{name}_b", f"{name}_m", f"{name}_v"], [y],
                             epsilon=1e-3),
            [_init(f"{name}_g", c), _init(f"{name}_b", c), _init(f"{name}_m", c), _init(f"{name}_v", c, positive=True)])


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


def _layernorm_nodes(opset, square="Pow", affine=True):
    axes = {"axes": [-1]} if opset < 18 else {}
    ax_in = [] if opset < 18 else ["ax"]
    nodes = [helper.make_node("ReduceMean", ["x", *ax_in], ["m"], **axes),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]) if square == "Pow" else helper.make_node("Mul", ["d", "d"], ["p"]),
             helper.make_node("ReduceMean", ["p", *ax_in], ["v"], **axes),
             helper.make_node("Add", ["v", "eps"], ["e"]),
             helper.make_node("Sqrt", ["e"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n" if affine else "y"])]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["ng"]), helper.make_node("Add", ["ng", "beta"], ["y"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"), _init("gamma", 16), _init("beta", 16),
             numpy_helper.from_array(np.array([-1], np.int64), "ax")]
    return nodes, inits


@pytest.mark.parametrize("opset,square,affine", [(17, "Pow", True), (18, "Mul", True), (17, "Pow", False)])
def test_fuse_layernorm(tmp_path, opset, square, affine):
    from mcp_compiler.passes.normalize import FuseLayerNormPass

    nodes, inits = _layernorm_nodes(opset, square, affine)
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 5, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 5, 16])], inits, opset=opset)
    feeds = {"x": rng.standard_normal((2, 5, 16)).astype(np.float32) * 3 + 1}
    model, r = _run(FuseLayerNormPass(), m, tmp_path, feeds)
    assert r.modified and r.stats["fused"] == 1 and _ops(model) == ["LayerNormalization"]


def test_layernorm_not_fused_below_opset_17(tmp_path):
    from mcp_compiler.passes.normalize import FuseLayerNormPass

    nodes, inits = _layernorm_nodes(13)
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 5, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 5, 16])], inits, opset=13)
    model, r = _run(FuseLayerNormPass(), m, tmp_path, {"x": rng.standard_normal((2, 5, 16)).astype(np.float32)})
    assert not r.modified and "opset 13" in r.stats["reason"] and len(model.graph.nodes) == 9


@pytest.mark.parametrize("form", ["outer-half", "inner-half", "mul-rsqrt2"])
def test_fuse_gelu(tmp_path, form):
    from mcp_compiler.passes.normalize import FuseGeluPass

    scale = (helper.make_node("Mul", ["x", "rs2"], ["a"]) if form == "mul-rsqrt2"
             else helper.make_node("Div", ["x", "s2"], ["a"]))
    nodes = [scale, helper.make_node("Erf", ["a"], ["e"]), helper.make_node("Add", ["e", "one"], ["b"])]
    if form == "inner-half":
        nodes += [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "b"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["x", "b"], ["c"]), helper.make_node("Mul", ["c", "half"], ["y"])]
    c = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    inits = [c(np.sqrt(2), "s2"), c(1 / np.sqrt(2), "rs2"), c(1.0, "one"), c(0.5, "half")]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 8])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 8])], inits, opset=20)
    model, r = _run(FuseGeluPass(), m, tmp_path, {"x": rng.standard_normal((4, 8)).astype(np.float32) * 3},
                    rtol=1e-5, atol=1e-6)
    assert r.modified and _ops(model) == ["Gelu"]


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


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_fuse_gelu_tanh(tmp_path, cube):
    from mcp_compiler.passes.normalize import FuseGeluPass

    c = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    x3 = ([helper.make_node("Pow", ["x", "three"], ["x3"])] if cube == "pow"
          else [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x", "x2"], ["x3"])])
    nodes = x3 + [helper.make_node("Mul", ["kappa", "x3"], ["k"]), helper.make_node("Add", ["x", "k"], ["s"]),
                  helper.make_node("Mul", ["beta", "s"], ["i"]), helper.make_node("Tanh", ["i"], ["t"]),
                  helper.make_node("Add", ["one", "t"], ["b"]), helper.make_node("Mul", ["x", "b"], ["xb"]),
                  helper.make_node("Mul", ["half", "xb"], ["y"])]   # torch's export of gelu(approximate="tanh")
    inits = [c(3.0, "three"), c(0.044715, "kappa"), c(np.sqrt(2 / np.pi), "beta"), c(1.0, "one"), c(0.5, "half")]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 8])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 8])], inits, opset=20)
    model, r = _run(FuseGeluPass(), m, tmp_path, {"x": rng.standard_normal((4, 8)).astype(np.float32) * 3},
                    rtol=1e-5, atol=1e-6)
    assert r.stats["tanh"] == 1 and _ops(model) == ["Gelu"]
    assert model.graph.nodes[0].attributes["approximate"].value == b"tanh"


def test_gelu_not_fused_when_a_constant_adds_dims(tmp_path):
    # 0.5 of shape [1, 1, 1] makes y rank 3 from a rank-2 x: Gelu(x) would change the shape
    from mcp_compiler.passes.normalize import FuseGeluPass

    c = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    nodes = [helper.make_node("Div", ["x", "s2"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["b"]), helper.make_node("Mul", ["x", "b"], ["xb"]),
             helper.make_node("Mul", ["xb", "half"], ["y"])]
    inits = [c(np.sqrt(2), "s2"), c(1.0, "one"), numpy_helper.from_array(np.full((1, 1, 1), 0.5, np.float32), "half")]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [4, 8])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8])], inits, opset=20)
    model, r = _run(FuseGeluPass(), m, tmp_path, {"x": rng.standard_normal((4, 8)).astype(np.float32)})
    assert not r.modified and "Gelu" not in _ops(model)


def test_gelu_not_fused_when_an_intermediate_is_used_elsewhere(tmp_path):
    from mcp_compiler.passes.normalize import FuseGeluPass

    c = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    nodes = [helper.make_node("Div", ["x", "s2"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["b"]), helper.make_node("Mul", ["x", "b"], ["xb"]),
             helper.make_node("Mul", ["xb", "half"], ["y"]), helper.make_node("Neg", ["e"], ["z"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [4, 8])],
              [helper.make_tensor_value_info(n, TP.FLOAT, [4, 8]) for n in ("y", "z")],
              [c(np.sqrt(2), "s2"), c(1.0, "one"), c(0.5, "half")], opset=20)
    model, r = _run(FuseGeluPass(), m, tmp_path, {"x": rng.standard_normal((4, 8)).astype(np.float32)})
    assert not r.modified and len(model.graph.nodes) == 6


def test_gelu_reason_names_the_opset_flag(tmp_path):
    from mcp_compiler.passes.normalize import FuseGeluPass

    m = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2])], [], opset=17)
    model, r = _run(FuseGeluPass(), m, tmp_path, {"x": np.ones(2, np.float32)})
    assert not r.modified and r.stats["reason"] == "opset 17 < 20 (--opset 20 enables it)"


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
    assert r.stats["hardsigmoid"] == 1 and _ops(model) == ["HardSigmoid"]
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


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_simplify_softmax_undoes_the_version_converters_coercion(tmp_path, op):
    from mcp_compiler.passes.normalize import SimplifySoftmaxPass

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Flatten", ["x"], ["f"], axis=2),
             helper.make_node(op, ["f"], ["o"], axis=1), helper.make_node("Reshape", ["o", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 7])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4, 7])], [], opset=13)
    model, r = _run(SimplifySoftmaxPass(), m, tmp_path, {"x": rng.standard_normal((3, 4, 7)).astype(np.float32)},
                    rtol=1e-6, atol=1e-7)
    assert r.stats["simplified"] == 1 and _ops(model) == [op]


def test_simplify_softmax_keeps_a_flatten_before_the_last_axis(tmp_path):
    # Flatten(axis=1) of a rank-3 x: the softmax runs over axes 1 and 2 together
    from mcp_compiler.passes.normalize import SimplifySoftmaxPass

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Flatten", ["x"], ["f"], axis=1),
             helper.make_node("Softmax", ["f"], ["o"], axis=1), helper.make_node("Reshape", ["o", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 7])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4, 7])], [], opset=13)
    model, r = _run(SimplifySoftmaxPass(), m, tmp_path, {"x": rng.standard_normal((3, 4, 7)).astype(np.float32)})
    assert not r.modified and len(model.graph.nodes) == 4


def test_opset_flag_upgrades_first_so_the_fusions_fire(tmp_path):
    # an opset-13 layer norm with the exported GELU after it: --opset 20 gives both fused ops
    import json

    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    nodes, inits = _layernorm_nodes(13)
    c = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    nodes[-1] = helper.make_node("Add", ["ng", "beta"], ["ln"])
    nodes += [helper.make_node("Div", ["ln", "s2"], ["a"]), helper.make_node("Erf", ["a"], ["er"]),
              helper.make_node("Add", ["er", "one"], ["b"]), helper.make_node("Mul", ["ln", "b"], ["xb"]),
              helper.make_node("Mul", ["xb", "half"], ["y"])]
    inits += [c(np.sqrt(2), "s2"), c(1.0, "one"), c(0.5, "half")]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 5, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 5, 16])], inits, opset=13)
    runner = CliRunner()
    r = runner.invoke(app, ["convert", "-i", str(tmp_path / "m.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                            "--opset", "20", "--json", "--verify", "--dims", "N=2"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["nodes"] == 2
    from mcp_compiler.mcpir import read_mcpir

    model = read_mcpir(tmp_path / "repo" / "m" / "1" / "model.mcpir")
    assert _ops(model) == ["LayerNormalization", "Gelu"]
    feeds = {"x": rng.standard_normal((2, 5, 16)).astype(np.float32)}
    np.testing.assert_allclose(ort_run(to_onnx(model), feeds)[0], ort_run(m, feeds)[0], rtol=RTOL, atol=ATOL)


def test_simplify_softmax_with_a_constant_shape_and_trailing_ones(tmp_path):
    # what the converter leaves for squeezenet's [1, 1000, 1, 1] scores: Flatten at the
    # default axis 1, the Reshape target a constant (the Shape folded)
    from mcp_compiler.passes.normalize import SimplifySoftmaxPass

    nodes = [helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("Softmax", ["f"], ["o"]),
             helper.make_node("Reshape", ["o", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 10, 1, 1])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 10, 1, 1])],
              [numpy_helper.from_array(np.array([2, 10, 1, 1], np.int64), "s")], opset=13)
    model, r = _run(SimplifySoftmaxPass(), m, tmp_path, {"x": rng.standard_normal((2, 10, 1, 1)).astype(np.float32)},
                    rtol=1e-6, atol=1e-7)
    assert r.stats["simplified"] == 1 and _ops(model) == ["Softmax"]
    assert model.graph.nodes[0].attributes["axis"].value == 1


def test_simplify_softmax_keeps_a_reshape_to_another_shape(tmp_path):
    from mcp_compiler.passes.normalize import SimplifySoftmaxPass

    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=1), helper.make_node("Softmax", ["f"], ["o"], axis=1),
             helper.make_node("Reshape", ["o", "s"], ["y"])]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 10])],
              [helper.make_tensor_value_info("y", TP.FLOAT, [5, 4])],
              [numpy_helper.from_array(np.array([5, 4], np.int64), "s")], opset=13)
    model, r = _run(SimplifySoftmaxPass(), m, tmp_path, {"x": rng.standard_normal((2, 10)).astype(np.float32)})
    assert not r.modified and len(model.graph.nodes) == 3
