"""The identity-elimination pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import pytest
from _exact_cases import F, X, _load, _ops, _run, _same_outputs
from _helpers import ort_run
from onnx import TensorProto, helper

from mcp_compiler.lower import to_onnx
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


@pytest.mark.parametrize("starts, ends, axes, removed", [
    ([0], [2**63 - 1], [1], True),        # PyTorch's x[:, 0:]
    ([0, 0], [2**31 - 1, 5], [0, 1], True),
    ([0], [5], [-1], True),               # ends at the static dim
    ([0], [4], [1], False),               # drops the last column
    ([1], [2**63 - 1], [1], False),
])
def test_a_slice_that_takes_everything_goes(tmp_path, starts, ends, axes, removed):
    from onnx import numpy_helper

    params = [numpy_helper.from_array(np.array(a, np.int64), k) for k, a in (("s", starts), ("e", ends), ("a", axes))]
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Slice", ["n", "s", "e", "a"], ["m"]),
                           helper.make_node("Relu", ["m"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", F, [2, 5])], [helper.make_tensor_value_info("y", F, ["d0", "d1"])], params)
    original, model = _load(tmp_path, g)
    r = _run(IdentityEliminationPass(), model)
    assert r.modified == removed
    assert _ops(model) == (["Neg", "Relu"] if removed else ["Neg", "Slice", "Relu"])
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(ort_run(to_onnx(model), {"x": x})[0], ort_run(original, {"x": x})[0])


@pytest.mark.parametrize("op, c, swap, removed", [
    ("Add", np.zeros(5, np.float32), False, True),          # a zero bias
    ("Add", np.zeros((1, 5), np.float32), True, True),      # 0 + x
    ("Mul", np.ones((2, 1), np.float32), False, True),
    ("Div", np.ones(1, np.float32), False, True),
    ("Sub", np.zeros(5, np.float32), True, False),          # 0 - x is -x
    ("Add", np.zeros((3, 2, 5), np.float32), False, False),  # broadcasting adds a dim
    ("Add", np.full(5, 1e-30, np.float32), False, False),
])
def test_neutral_constants_go(tmp_path, op, c, swap, removed):
    from onnx import numpy_helper

    ins = ["c", "n"] if swap else ["n", "c"]
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["n"]), helper.make_node(op, ins, ["m"]),
                           helper.make_node("Relu", ["m"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", F, [2, 5])],
                          [helper.make_tensor_value_info("y", F, ["d0", "d1", "d2"][:max(2, c.ndim)])],
                          [numpy_helper.from_array(c, "c")])
    original, model = _load(tmp_path, g)
    assert _run(IdentityEliminationPass(), model).modified == removed
    assert _ops(model) == (["Neg", "Relu"] if removed else ["Neg", op, "Relu"])
    x = np.arange(10, dtype=np.float32).reshape(2, 5) - 4
    np.testing.assert_array_equal(ort_run(to_onnx(model), {"x": x})[0], ort_run(original, {"x": x})[0])


def test_zero_initial_states_of_an_lstm_are_dropped(tmp_path):
    """initial_h a Slice of ConstantOfShape(0), initial_c a zero constant: both are the default."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 16, 3)).astype(np.float32), "w")
    r = numpy_helper.from_array(rng.standard_normal((1, 16, 4)).astype(np.float32), "r")
    shape = numpy_helper.from_array(np.array([2, 2, 4], np.int64), "hshape")
    slices = [numpy_helper.from_array(np.array([v], np.int64), f"i{v}") for v in (0, 1)]
    c0 = numpy_helper.from_array(np.zeros((1, 2, 4), np.float32), "c0")
    nodes = [helper.make_node("ConstantOfShape", ["hshape"], ["h0"],
                              value=numpy_helper.from_array(np.zeros(1, np.float32))),
             helper.make_node("Slice", ["h0", "i0", "i1"], ["h0_first"]),
             helper.make_node("LSTM", ["x", "w", "r", "", "", "h0_first", "c0"], ["y"], hidden_size=4)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [5, 2, 3])],
                          [helper.make_tensor_value_info("y", F, [5, 1, 2, 4])], [w, r, shape, c0, *slices])
    original, model = _load(tmp_path, g)
    result = _run(IdentityEliminationPass(), model)
    assert result.stats["zero_states_dropped"] == 2
    lstm = model.graph.nodes[-1]
    assert lstm.inputs[5:] == (None, None)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(to_onnx(model), {"x": x})[0], ort_run(original, {"x": x})[0])
