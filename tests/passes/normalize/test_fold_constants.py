"""The fold-constants pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import onnx
from _exact_cases import F, X, _load, _ops, _run
from _helpers import ort_run
from onnx import TensorProto, helper, numpy_helper

from mcp_compiler.lower import to_onnx


def test_fold_constants(tmp_path):
    from mcp_compiler.passes.normalize import FoldConstantsPass

    a = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "a")
    b = numpy_helper.from_array(np.full((2, 3), 2.0, np.float32), "b")
    big = numpy_helper.from_array(np.array([4096, 4096], np.int64), "big_shape")
    g = helper.make_graph(
        [helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Sqrt", ["ab"], ["s"]),
         helper.make_node("Add", ["x", "s"], ["y"]),
         helper.make_node("Shape", ["x"], ["xs"]),  # x has a static shape: folds
         helper.make_node("ConstantOfShape", ["big_shape"], ["huge"]),  # 64 MiB from 16 bytes: never
         helper.make_node("ReduceSum", ["huge"], ["hs"], keepdims=0),
         helper.make_node("RandomUniformLike", ["a"], ["r"]),  # random: never
         helper.make_node("Mul", ["r", "hs"], ["rh"])],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3]), helper.make_tensor_value_info("xs", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("rh", F, [2, 3])], [a, b, big])
    orig, model = _load(tmp_path, g)
    r = _run(FoldConstantsPass(), model)
    # s (ab folded along, then dead) and hs: the 64 MiB intermediate is evaluated, never stored
    assert r.modified and r.stats == {"nodes_folded": 4, "values_replaced": 2}
    assert _ops(model) == ["Add", "Shape", "RandomUniformLike", "Mul"]  # Shape: its output is a graph output
    assert model.graph.initializers["hs"].const.numpy() == 0
    np.testing.assert_allclose(model.graph.initializers["s"].const.numpy(), np.sqrt(np.arange(6).reshape(2, 3) * 2.0), rtol=1e-6)
    feeds = {"x": X}
    want, got = ort_run(orig, feeds), ort_run(to_onnx(model), feeds)
    np.testing.assert_array_equal(want[0], got[0])
    np.testing.assert_array_equal(want[1], got[1])
    assert not _run(FoldConstantsPass(), model).modified


def test_a_folded_scalar_stays_a_scalar(tmp_path):
    """Gather of a constant at a scalar index is a scalar: folded, it keeps rank 0 (np.ascontiguousarray
    would make it a [1] vector, and a later Unsqueeze 2-D)."""
    from mcp_compiler.passes.normalize import FoldConstantsPass

    nodes = [helper.make_node("Gather", ["c", "i"], ["s"], axis=0), helper.make_node("Mul", ["x", "s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          [numpy_helper.from_array(np.array([4, 6, 8], np.float32), "c"),
                           numpy_helper.from_array(np.array(1, np.int64), "i")])
    original, model = _load(tmp_path, g)
    _run(FoldConstantsPass(), model)
    assert model.graph.initializers["s"].const.dims == ()
    assert _ops(model) == ["Mul"]
    for a, b in zip(ort_run(original, {"x": X}), ort_run(to_onnx(model), {"x": X})):
        np.testing.assert_array_equal(b, a)


def _lstm_like_weights(tmp_path, in_branch: bool):
    """A packed weight W [8, 4] reordered by three Slices and a Concat (PyTorch's LSTM gate
    order), used by a MatMul in the main graph and, when `in_branch`, by the same reordering
    inside both branches of an If on a graph input."""
    from onnx import TensorProto as TP

    w = numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(8, 4) / 7, "w")
    consts = [numpy_helper.from_array(np.array([v], np.int64), f"c{v}") for v in (0, 2, 6, 8)]

    def reorder(p):
        return [helper.make_node("Slice", ["w", "c0", "c2"], [f"{p}a"]),
                helper.make_node("Slice", ["w", "c6", "c8"], [f"{p}b"]),
                helper.make_node("Slice", ["w", "c2", "c6"], [f"{p}c"]),
                helper.make_node("Concat", [f"{p}a", f"{p}b", f"{p}c"], [f"{p}w"], axis=0),
                helper.make_node("Transpose", [f"{p}w"], [f"{p}t"]),
                helper.make_node("MatMul", ["x", f"{p}t"], [f"{p}y"])]

    def branch(p):
        return helper.make_graph(reorder(p), p, [], [helper.make_tensor_value_info(f"{p}y", F, [2, 8])])

    nodes = reorder("m_")
    outputs = [helper.make_tensor_value_info("m_y", F, [2, 8])]
    inputs = [helper.make_tensor_value_info("x", F, [2, 4])]
    if in_branch:
        nodes.append(helper.make_node("If", ["flag"], ["z"], then_branch=branch("t_"), else_branch=branch("e_")))
        outputs.append(helper.make_tensor_value_info("z", F, [2, 8]))
        inputs.append(helper.make_tensor_value_info("flag", TP.BOOL, []))
    return _load(tmp_path, helper.make_graph(nodes, "g", inputs, outputs, [w, *consts]))


def test_slices_of_one_weight_fold_together(tmp_path):
    """No single Slice frees W (the others still read it), the group does: the reordered weight
    (128 bytes, over the 64-byte small-result limit) is stored and W goes."""
    from mcp_compiler.passes.normalize import DeadCodeEliminationPass, FoldConstantsPass

    original, model = _lstm_like_weights(tmp_path, in_branch=False)
    _run(FoldConstantsPass(), model)
    _run(DeadCodeEliminationPass(), model)
    assert _ops(model) == ["MatMul"]
    assert sum(v.const.nbytes for v in model.graph.initializers.values()) <= 128
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    for a, b in zip(ort_run(original, feeds), ort_run(to_onnx(model), feeds)):
        np.testing.assert_array_equal(b, a)


def test_folds_inside_if_branches_and_equal_results_count_once(tmp_path):
    """The same reordering in the main graph and in both branches: folded everywhere (three equal
    results, counted once against W), and deduplicate-weights leaves one copy (the branches read
    the main graph's)."""
    from mcp_compiler.passes.normalize import DeadCodeEliminationPass, DeduplicateWeightsPass, FoldConstantsPass

    original, model = _lstm_like_weights(tmp_path, in_branch=True)
    r = _run(FoldConstantsPass(), model)
    assert r.stats["values_replaced"] == 3
    _run(DeadCodeEliminationPass(), model)
    _run(DeduplicateWeightsPass(), model)
    assert [n.op_type for n in model.graph.walk()] == ["MatMul", "If", "MatMul", "MatMul"]
    weights = [v for g in model.graph.graphs() for v in g.initializers.values()]
    assert len(weights) == 1 and weights[0].const.nbytes == 128
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for flag in (True, False):
        feeds = {"x": x, "flag": np.array(flag)}
        for a, b in zip(ort_run(original, feeds), ort_run(to_onnx(model), feeds)):
            np.testing.assert_array_equal(b, a)


def test_a_weight_that_is_also_an_input_is_not_freed(tmp_path):
    """IR < 4 style: W is an initializer and a graph input (a caller may override it), so folding
    Unsqueeze(W) would store a second copy: the weights would grow. Nor does a small float result
    fold for nothing (a 16-byte ConstantOfShape output is a generated weight)."""
    from mcp_compiler.passes.normalize import FoldConstantsPass

    w = numpy_helper.from_array(np.arange(64, dtype=np.float32), "w")
    shape = numpy_helper.from_array(np.array([4], np.int64), "shape")
    nodes = [helper.make_node("Unsqueeze", ["w", "ax"], ["wu"]), helper.make_node("Mul", ["x", "wu"], ["y"]),
             helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Add", ["x4", "ones"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 64]),
                                       helper.make_tensor_value_info("x4", F, [4]),
                                       helper.make_tensor_value_info("w", F, [64])],
                          [helper.make_tensor_value_info("y", F, [2, 64]), helper.make_tensor_value_info("z", F, [4])],
                          [w, shape, numpy_helper.from_array(np.array([0], np.int64), "ax")])
    original, model = _load(tmp_path, g)
    r = _run(FoldConstantsPass(), model)
    assert not r.modified and _ops(model) == ["Unsqueeze", "Mul", "ConstantOfShape", "Add"]


def _moves(tmp_path, nodes, consts, opset):
    """The fold set of a graph of constants, moved in numpy and run in onnxruntime."""
    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.passes.normalize.fold_constants import _foldable, _move
    from mcp_compiler.passes.normalize.fold_constants import _run as run_in_ort

    outs = [helper.make_empty_tensor_value_info(o) for n in nodes for o in n.output]
    g = helper.make_graph(nodes, "g", [], outs, [numpy_helper.from_array(v, k) for k, v in consts.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), tmp_path / "m.onnx")
    model = load_onnx(tmp_path / "m.onnx", check=False).model   # (outputs left untyped: whatever comes)
    g = model.graph
    fold = _foldable(g, {id(v) for v in g.initializers.values()})
    assert len(fold) == len(nodes)
    wanted = [n.outputs[0] for n in fold]
    try:
        ran = run_in_ort(model, g, fold, wanted, {})
    except Exception:  # noqa: BLE001 - onnxruntime refuses it: numpy must not fold it either
        ran = None
    return _move(fold, wanted, {}, opset), ran


def test_data_movement_folds_in_numpy_as_onnxruntime_computes_it(tmp_path):
    """Reshape, Squeeze, Unsqueeze, Flatten, Identity and integer Casts of constants are moved in
    numpy (no onnxruntime session): equal to what onnxruntime computes, dtype and shape included."""
    c = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.array([[1], [200], [0]], np.int64),
         "u": np.array([200, 7], np.uint8), "b": np.array([True, False]),
         "s0": np.array([0, -1], np.int64), "s32": np.array([3, 2], np.int64), "ax": np.array([1, -1], np.int64),
         "ax1": np.array([-1], np.int64), "six": np.arange(6, dtype=np.int64)}
    cases = [
        (17, [helper.make_node("Reshape", ["a", "s0"], ["r"])]),
        (17, [helper.make_node("Reshape", ["a", "s32"], ["r"], allowzero=1)]),
        (17, [helper.make_node("Unsqueeze", ["a", "ax"], ["r"]), helper.make_node("Identity", ["r"], ["r2"])]),
        (11, [helper.make_node("Unsqueeze", ["a"], ["r"], axes=[0, -1])]),
        (11, [helper.make_node("Squeeze", ["i"], ["r"], axes=[1])]),
        (17, [helper.make_node("Squeeze", ["i"], ["r"]), helper.make_node("Squeeze", ["i", "ax1"], ["r2"])]),
        (17, [helper.make_node("Flatten", ["i"], ["r"], axis=0), helper.make_node("Flatten", ["a"], ["r2"], axis=-1)]),
        (17, [helper.make_node("Shape", ["a"], ["r"]), helper.make_node("Reshape", ["six", "r"], ["r2"])]),
        (17, [helper.make_node("Cast", ["i"], ["r"], to=TensorProto.FLOAT),
              helper.make_node("Cast", ["u"], ["r2"], to=TensorProto.INT8),    # wraps: 200 -> -56
              helper.make_node("Cast", ["i"], ["r3"], to=TensorProto.BOOL),
              helper.make_node("Cast", ["b"], ["r4"], to=TensorProto.INT64),
              helper.make_node("Cast", ["r3"], ["r5"], to=TensorProto.DOUBLE)]),
    ]
    for opset, nodes in cases:
        moved, ran = _moves(tmp_path, nodes, c, opset)
        assert moved is not None and ran is not None, nodes
        for m, r in zip(moved, ran):
            assert m.dtype == r.dtype and m.shape == r.shape, (nodes, m, r)
            np.testing.assert_array_equal(m, r)


def test_what_numpy_does_not_move_is_left_to_onnxruntime(tmp_path):
    """A float Cast, an op outside the set, or a move numpy refuses: not moved (onnxruntime runs
    it, or refuses it too and the stats say so)."""
    c = {"a": np.array([[1.5, np.nan, 3e10]], np.float32), "bad": np.array([4, 4], np.int64),
         "ax0": np.array([1], np.int64)}
    for nodes in ([helper.make_node("Cast", ["a"], ["r"], to=TensorProto.INT64)],
                  [helper.make_node("Reshape", ["a", "bad"], ["r"])],
                  [helper.make_node("Squeeze", ["a", "ax0"], ["r"])],
                  [helper.make_node("Shape", ["a"], ["r"], start=1)],   # start/end: left to onnxruntime
                  [helper.make_node("Reshape", ["a", "ax0"], ["r"]), helper.make_node("Neg", ["r"], ["r2"])]):
        moved, ran = _moves(tmp_path, nodes, c, 17)
        assert moved is None, nodes
    assert _moves(tmp_path, [helper.make_node("Reshape", ["a", "bad"], ["r"])], c, 17)[1] is None
