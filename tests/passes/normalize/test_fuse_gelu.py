"""The fuse-gelu pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import pytest
from _fusion_cases import _ops, _run, _save, rng
from onnx import TensorProto as TP
from onnx import helper, numpy_helper


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
