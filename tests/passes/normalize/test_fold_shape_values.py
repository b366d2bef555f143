"""The fold-shape-values pass: shape arithmetic on dims symbolic inference knows becomes
constants; onnxruntime outputs stay equal to the original's."""

from __future__ import annotations

import numpy as np
from _exact_cases import _ops, _run, _same_outputs
from _helpers import save_model
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.normalize import DeadCodeEliminationPass, FoldShapeValuesPass


def _i64(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def test_static_dims_of_a_dynamic_value_fold_and_reshape_copies_the_batch(tmp_path):
    """flat = Reshape(x, [Shape(x)[0], Shape(x)[1] * Shape(x)[2]]) on x [N, 80, 40]: the product is
    3200 whatever N is, and the target becomes [0, 3200] (0: copy N)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["a"], axis=0),
             helper.make_node("Gather", ["s", "i2"], ["b"], axis=0),
             helper.make_node("Mul", ["a", "b"], ["ab"]),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Unsqueeze", ["ab", "ax"], ["ab1"]),
             helper.make_node("Concat", ["n1", "ab1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    path = save_model(tmp_path, "m", nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 80, 40])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 3200])],
                      [_i64("i0", 0), _i64("i1", 1), _i64("i2", 2), _i64("ax", [0])])
    import onnx

    original = onnx.load(path)
    model = load_onnx(path).model
    r = _run(FoldShapeValuesPass(), model)
    assert r.modified and r.stats["reshape_targets"] == 1 and r.stats["values_folded"] >= 1
    DeadCodeEliminationPass().run(model, PassContext())
    assert _ops(model) == ["Reshape"]
    target = model.graph.nodes[0].inputs[1].const.numpy().tolist()
    assert target == [0, 3200]
    _same_outputs(original, model, {"x": np.random.default_rng(0).standard_normal((3, 80, 40)).astype(np.float32)})


def test_lstm_output_dims_are_known(tmp_path):
    """Shape of an LSTM's Y: [seq, dirs, batch, hidden], so dims 0, 1 and 3 fold."""
    rng = np.random.default_rng(0)
    h = 8
    nodes = [helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=h),
             helper.make_node("Shape", ["y"], ["s"]),
             helper.make_node("Gather", ["s", "i3"], ["hid"], axis=0),
             helper.make_node("Cast", ["hid"], ["out"], to=TP.INT64)]
    path = save_model(tmp_path, "lstm", nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [5, "B", 4])],
                      [helper.make_tensor_value_info("out", TP.INT64, [])],
                      [numpy_helper.from_array(rng.standard_normal((1, 4 * h, 4)).astype(np.float32), "w"),
                       numpy_helper.from_array(rng.standard_normal((1, 4 * h, h)).astype(np.float32), "r"),
                       _i64("i3", 3)])
    model = load_onnx(path).model
    r = _run(FoldShapeValuesPass(), model)
    assert r.modified
    cast = next(n for n in model.graph.nodes if n.op_type == "Cast")
    c = cast.inputs[0].const
    assert c is not None and c.dims == () and int(c.numpy()) == h   # a scalar, as Gather made it


def test_shape_values_fold_inside_if_branches(tmp_path):
    """Silero's pattern: inside an If branch, If(Shape(state)[0] == 1, ..., Identity) on a state
    [2, N, 128] of the main graph: the dim is 2 whatever N is, the condition a constant false, and
    inline-constant-if then takes the Identity."""
    from mcp_compiler.passes.normalize import FoldConstantsPass, InlineConstantIfPass

    inner = helper.make_node(
        "If", ["is1"], ["picked"],
        then_branch=helper.make_graph([helper.make_node("Abs", ["state"], ["sq"])], "t", [],
                                      [helper.make_tensor_value_info("sq", TP.FLOAT, None)]),
        else_branch=helper.make_graph([helper.make_node("Identity", ["state"], ["id"])], "e", [],
                                      [helper.make_tensor_value_info("id", TP.FLOAT, None)]))
    branch = helper.make_graph(
        [helper.make_node("Shape", ["state"], ["s"]), helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
         helper.make_node("Equal", ["d0", "one"], ["is1"]), inner, helper.make_node("Relu", ["picked"], ["r"])],
        "b", [], [helper.make_tensor_value_info("r", TP.FLOAT, None)])
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=branch,
                              else_branch=helper.make_graph([helper.make_node("Neg", ["state"], ["n"])], "o", [],
                                                            [helper.make_tensor_value_info("n", TP.FLOAT, None)]))]
    path = save_model(tmp_path, "m", nodes, [helper.make_tensor_value_info("state", TP.FLOAT, [2, "N", 128]),
                                             helper.make_tensor_value_info("flag", TP.BOOL, [])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, [2, "N", 128])],
                      [_i64("i0", 0), _i64("one", 1)])
    import onnx

    original, model = onnx.load(path), load_onnx(path).model
    assert _run(FoldShapeValuesPass(), model).stats["values_folded"] >= 1
    FoldConstantsPass().run(model, PassContext())
    InlineConstantIfPass().run(model, PassContext())
    DeadCodeEliminationPass().run(model, PassContext())
    assert sorted(n.op_type for n in model.graph.walk()) == ["Identity", "If", "Neg", "Relu"]
    state = np.random.default_rng(0).standard_normal((2, 3, 128)).astype(np.float32)
    for flag in (True, False):
        _same_outputs(original, model, {"state": state, "flag": np.array(flag)})
