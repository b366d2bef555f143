"""fuse-clip: chains of Relu / Min / Max / Clip become one Clip (or Relu), outputs bit-identical."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _helpers import ort_run
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.normalize import DeadCodeEliminationPass, FuseClipPass

X = np.linspace(-10, 10, 120, dtype=np.float32).reshape(2, 60)


def _c(v, name):
    return numpy_helper.from_array(np.array(v, np.float32), name)


def _run(tmp_path, nodes, inits, opset=13, shape=(2, 60)):
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, list(shape))],
                                            [helper.make_tensor_value_info("y", TP.FLOAT, list(shape))], inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(m, tmp_path / "m.onnx")
    model = load_onnx(tmp_path / "m.onnx").model
    r = FuseClipPass().run(model, PassContext())
    DeadCodeEliminationPass().run(model, PassContext())
    verify(model)
    x = X.reshape(shape) if int(np.prod(shape)) == X.size else np.ones(shape, np.float32)
    np.testing.assert_array_equal(ort_run(to_onnx(model), {"x": x})[0], ort_run(m, {"x": x})[0])
    return model, r


def _ops(model):
    return [n.op_type for n in model.graph.nodes]


def _bounds(model):
    from mcp_compiler.passes._rewrite import clip_bounds

    return clip_bounds(model.graph.nodes[0])


@pytest.mark.parametrize("first,second", [("Max", "Min"), ("Min", "Max")])
def test_min_max_becomes_clip(tmp_path, first, second):
    consts = {"Max": "lo", "Min": "hi"}
    nodes = [helper.make_node(first, ["x", consts[first]], ["a"]), helper.make_node(second, [consts[second], "a"], ["y"])]
    model, r = _run(tmp_path, nodes, [_c(-1.5, "lo"), _c(4.0, "hi")])
    assert r.stats == {"fired": 1, "chains_merged": 1}
    assert _ops(model) == ["Clip"] and _bounds(model) == (-1.5, 4.0)


def test_relu_then_min_and_clip_chain(tmp_path):
    # Relu -> Min(., 8) -> Clip(., -3, 6) -> Max(., 1): one Clip(x, 1, 6)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Min", ["r", "eight"], ["m"]),
             helper.make_node("Clip", ["m", "m3", "six"], ["c"]), helper.make_node("Max", ["c", "one"], ["y"])]
    model, r = _run(tmp_path, nodes, [_c(8.0, "eight"), _c(-3.0, "m3"), _c(6.0, "six"), _c(1.0, "one")])
    assert r.stats["chains_merged"] == 1 and _ops(model) == ["Clip"] and _bounds(model) == (1.0, 6.0)


def test_relu_relu_is_one_relu_and_old_opsets_use_attributes(tmp_path):
    model, _ = _run(tmp_path, [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])], [])
    assert _ops(model) == ["Relu"]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r"], ["y"], max=6.0)]
    model, _ = _run(tmp_path, nodes, [], opset=9)
    assert _ops(model) == ["Clip"] and model.graph.nodes[0].attributes["min"].value == 0.0
    assert model.graph.nodes[0].attributes["max"].value == 6.0


def test_disjoint_intervals_and_shared_values_stay(tmp_path):
    # Min(., -1) then Max(., 1): [max(-inf, 1), min(-1, inf)] is empty (the result is constant 1)
    nodes = [helper.make_node("Min", ["x", "m1"], ["a"]), helper.make_node("Max", ["a", "one"], ["y"])]
    model, r = _run(tmp_path, nodes, [_c(-1.0, "m1"), _c(1.0, "one")])
    assert not r.modified and _ops(model) == ["Min", "Max"]
    # the Relu's result is used twice: merging would lose it
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Min", ["r", "six"], ["m"]),
             helper.make_node("Add", ["m", "r"], ["y"])]
    model, r = _run(tmp_path, nodes, [_c(6.0, "six")])
    assert not r.modified


def test_a_constant_that_broadcasts_to_more_dims_is_not_a_bound(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Min", ["r", "six"], ["y"])]
    inits = [numpy_helper.from_array(np.full((1, 1, 1), 6.0, np.float32), "six")]
    model, r = _run(tmp_path, nodes, inits)
    assert not r.modified and _ops(model) == ["Relu", "Min"]
