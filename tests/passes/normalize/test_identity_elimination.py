"""The identity-elimination pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

from _exact_cases import F, X, _load, _ops, _run, _same_outputs
from onnx import TensorProto, helper

from mcp_compiler.passes.normalize import (
    IdentityEliminationPass,
)


def test_identity_elimination(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["i"]),
         helper.make_node("Dropout", ["i"], ["d"]),
         helper.make_node("Cast", ["d"], ["c"], to=TensorProto.FLOAT),
         helper.make_node("Transpose", ["c"], ["t"], perm=[0, 1]),
         helper.make_node("Relu", ["t"], ["r"]),
         helper.make_node("Identity", ["r"], ["y"])],  # graph output: Relu makes y instead
        "g", [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])
    orig, model = _load(tmp_path, g)
    r = _run(IdentityEliminationPass(), model)
    assert r.stats["nodes_removed"] == 5
    assert _ops(model) == ["Relu"] and model.graph.nodes[0].outputs[0] is model.graph.outputs[0]
    assert model.graph.outputs[0].name == "y"
    _same_outputs(orig, model, {"x": X})


def test_identity_to_graph_output_keeps_the_interface(tmp_path):
    # r feeds both an output through Identity and another node: the other node reads y then;
    # an input passed straight through, and a value that is an output itself, keep their Identity
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Identity", ["r"], ["y"]),
         helper.make_node("Neg", ["r"], ["z"]),
         helper.make_node("Identity", ["x"], ["x_out"]),
         helper.make_node("Identity", ["z"], ["z2"])],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info(n, F, [2, 3]) for n in ("y", "z", "x_out", "z2")])
    orig, model = _load(tmp_path, g)
    r = _run(IdentityEliminationPass(), model)
    assert r.stats["nodes_removed"] == 1
    assert _ops(model) == ["Relu", "Neg", "Identity", "Identity"]
    assert [o.name for o in model.graph.outputs] == ["y", "z", "x_out", "z2"]
    assert model.graph.nodes[1].inputs[0] is model.graph.outputs[0]
    _same_outputs(orig, model, {"x": X})


def test_identity_elimination_does_not_fire_on_real_work(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.INT32),
         helper.make_node("Transpose", ["c"], ["t"], perm=[1, 0]),
         helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT)],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [3, 2])])
    orig, model = _load(tmp_path, g)
    assert not _run(IdentityEliminationPass(), model).modified
    _same_outputs(orig, model, {"x": X})
