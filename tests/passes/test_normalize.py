"""Normalization passes: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PASSES, PassContext, PassManager, PipelineError, Property, Repeat
from mcp_compiler.passes.normalize import (CommonSubexpressionEliminationPass,
                                           ConstantToInitializerPass, DeadCodeEliminationPass,
                                           DeduplicateWeightsPass, IdentityEliminationPass)
from mcp_compiler.pipeline import default_pipeline

from _helpers import golden_dirs, ort_run, zoo_params, ZOO_INPUTS

F = TensorProto.FLOAT
RTOL, ATOL = 0.0, 0.0  # these passes move no arithmetic: outputs stay bit-identical


def _load(tmp_path, graph, opset=17, ir_version=8):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    return m, load_onnx(p).model


def _run(p, model):
    result = p.run(model, PassContext(verify_each=True))
    verify(result.model)
    return result


def _same_outputs(original, model, feeds, rtol=None, atol=None):
    for a, b in zip(ort_run(original, feeds), ort_run(to_onnx(model), feeds)):
        np.testing.assert_allclose(b, a, rtol=RTOL if rtol is None else rtol, atol=ATOL if atol is None else atol)


def _ops(model):
    return [n.op_type for n in model.graph.nodes]


X = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_constant_to_initializer(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones((2, 3), np.float32))),
         helper.make_node("Constant", [], ["k"], value_float=2.0),
         helper.make_node("Constant", [], ["ints"], value_ints=[1, 2]),
         helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Mul", ["a", "k"], ["y"]),
         helper.make_node("Shape", ["ints"], ["s"])],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3]), helper.make_tensor_value_info("s", TensorProto.INT64, [1])])
    orig, model = _load(tmp_path, g)
    r = _run(ConstantToInitializerPass(), model)
    assert r.modified and r.stats["constants_moved"] == 3
    assert _ops(model) == ["Add", "Mul", "Shape"]
    assert model.graph.initializers["k"].const.dtype.name == "FLOAT"
    assert model.graph.initializers["ints"].const.numpy().tolist() == [1, 2]
    _same_outputs(orig, model, {"x": X})
    assert not _run(ConstantToInitializerPass(), model).modified  # nothing left: says so


def test_constant_to_initializer_keeps_graph_outputs_and_old_ir(tmp_path):
    g = helper.make_graph([helper.make_node("Constant", [], ["y"], value_float=1.0)], "g", [],
                          [helper.make_tensor_value_info("y", F, [])])
    _, model = _load(tmp_path, g)
    assert not _run(ConstantToInitializerPass(), model).modified
    one = numpy_helper.from_array(np.array(1.0, np.float32))
    g = helper.make_graph([helper.make_node("Constant", [], ["c"], value=one),
                           helper.make_node("Neg", ["c"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", F, [])])
    _, model = _load(tmp_path, g, opset=9, ir_version=3)
    r = _run(ConstantToInitializerPass(), model)
    assert not r.modified and r.stats == {"skipped_ir_version_below_4": 1}


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


def test_cse_and_dce(tmp_path):
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["y"]),
         helper.make_node("Sigmoid", ["x"], ["dead1"]), helper.make_node("Neg", ["dead1"], ["dead2"]),
         helper.make_node("RandomUniformLike", ["x"], ["r1"]), helper.make_node("RandomUniformLike", ["x"], ["r2"])],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])],
        [numpy_helper.from_array(np.zeros(3, np.float32), "unused")])
    orig, model = _load(tmp_path, g)
    r = _run(CommonSubexpressionEliminationPass(), model)
    assert r.stats["nodes_merged"] == 1  # the two Relus; random ops never merge
    r = _run(DeadCodeEliminationPass(), model)
    assert r.stats == {"nodes_removed": 4, "initializers_removed": 1}
    assert _ops(model) == ["Relu", "Add"] and "unused" not in model.graph.initializers
    _same_outputs(orig, model, {"x": X})
    assert not _run(DeadCodeEliminationPass(), model).modified


def test_dce_keeps_values_used_in_subgraphs(tmp_path):
    then_g = helper.make_graph([helper.make_node("Neg", ["outer"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [2, 3])])
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["outer"]), helper.make_node("If", ["cond"], ["y"],
                                                                     then_branch=then_g, else_branch=else_g)],
        "g", [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [2, 3])])
    orig, model = _load(tmp_path, g)
    assert not _run(DeadCodeEliminationPass(), model).modified
    for c in (True, False):
        _same_outputs(orig, model, {"x": X, "cond": np.array(c)})


def test_deduplicate_weights(tmp_path):
    w = numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w1")
    w2 = numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w2")
    w3 = numpy_helper.from_array(np.full((3, 2), 0.5, np.float32), "w3")  # same bytes, other dims
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "w1"], ["a"]), helper.make_node("Mul", ["a", "w2"], ["b"]),
         helper.make_node("Transpose", ["w3"], ["w3t"]), helper.make_node("Sub", ["b", "w3t"], ["y"])],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])],
        [w, w2, w3])
    orig, model = _load(tmp_path, g)
    r = _run(DeduplicateWeightsPass(), model)
    assert r.stats == {"initializers_merged": 1, "bytes_saved": 24}
    assert sorted(model.graph.initializers) == ["w1", "w3"]
    _same_outputs(orig, model, {"x": X})


@pytest.mark.parametrize("external", [False, True])
def test_deduplicate_large_weights_by_fingerprint_then_bytes(tmp_path, external):
    from mcp_compiler.passes.normalize.dedup_weights import _fingerprint

    # 64 KiB tensors: the sampled fingerprint decides first; "mid" differs from "a" only between
    # the sampled pieces, so only the whole-bytes comparison tells them apart. With external
    # data the bytes are read from the file (pread), not through the mapping.
    base = np.arange(16384, dtype=np.float32)
    mid = base.copy()
    mid[1500] = -1.0  # byte 6000: between the first two sampled pieces
    inits = [numpy_helper.from_array(base, "a"), numpy_helper.from_array(base.copy(), "b"),
             numpy_helper.from_array(mid, "mid")]
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "a"], ["s1"]), helper.make_node("Add", ["s1", "b"], ["s2"]),
         helper.make_node("Add", ["s2", "mid"], ["y"])],
        "g", [helper.make_tensor_value_info("x", F, [16384])], [helper.make_tensor_value_info("y", F, [16384])],
        inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "m.onnx"
    if external:
        onnx.save(m, p, save_as_external_data=True, location="w.bin", size_threshold=0)
    else:
        onnx.save(m, p)
    model = load_onnx(p).model
    consts = {n: model.graph.initializers[n].const for n in ("a", "b", "mid")}
    assert all((t.source is not None) == external for t in consts.values())
    assert _fingerprint(consts["a"]) == _fingerprint(consts["mid"])  # the bytes decide, not the samples
    r = _run(DeduplicateWeightsPass(), model)
    assert r.stats == {"initializers_merged": 1, "bytes_saved": 65536}
    assert sorted(model.graph.initializers) == ["a", "mid"]
    _same_outputs(p, model, {"x": np.ones(16384, np.float32)})


@pytest.mark.parametrize("src", [d / "model.onnx" for d in golden_dirs()] + zoo_params(),
                         ids=lambda p: p.parent.name if p.name == "model.onnx" else p.stem)
def test_default_pipeline_preserves_outputs(src):
    from mcp_compiler.targets import get_target

    model = load_onnx(src).model
    pm = PassManager(default_pipeline(get_target("triton-v1.12")), PassContext(verify_each=True))
    _, records = pm.run(model)
    assert records and all(r.nodes_after <= r.nodes_before for r in records)
    if src.name in ZOO_INPUTS:
        feeds = {"x": np.random.default_rng(0).random(ZOO_INPUTS[src.name], dtype=np.float32)}
    else:
        feeds = dict(np.load(src.parent / "inputs.npz"))
    # the default pipeline includes the fusions (BN folding, ...): float32 rounding of folded weights
    _same_outputs(src, model, feeds, rtol=1e-4, atol=1e-5)


def test_plan_is_checked_before_running():
    class NeedsLegal(IdentityEliminationPass):
        name = "needs-legal"
        requires = frozenset({Property.TARGET_LEGAL})

    with pytest.raises(PipelineError, match="needs-legal requires target-legal"):
        PassManager([ConstantToInitializerPass(), NeedsLegal()])
    PassManager([Repeat([DeadCodeEliminationPass()])])  # fine


def test_pass_failure_names_the_pass(tmp_path, tiny_model):
    from mcp_compiler.passes import PassError

    class Broken(IdentityEliminationPass):
        name = "broken"

        def run(self, model, ctx):
            raise RuntimeError("boom")

    onnx.save(tiny_model, tmp_path / "t.onnx")
    model = load_onnx(tmp_path / "t.onnx").model
    with pytest.raises(PassError, match=r"pass broken failed \(after dead-code-elimination\): RuntimeError: boom"):
        PassManager([DeadCodeEliminationPass(), Broken()]).run(model)


def test_registry_names_are_kebab_case():
    assert all(n == c.name and n == n.lower() and n.replace("-", "").isalnum() and n[0].isalpha()
               for n, c in PASSES.items())


def test_default_pipeline_on_a_model_with_functions(tmp_path):
    # Constants inside a function body must stay nodes: FunctionProto has no initializers.
    from mcp_compiler.targets import get_target

    fn = helper.make_function(
        "custom", "AddOne", ["a"], ["b"],
        [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones(3, np.float32))),
         helper.make_node("Identity", ["one"], ["one2"]),
         helper.make_node("Add", ["a", "one2"], ["b"])], [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("AddOne", ["x"], ["y"], domain="custom")], "g",
                          [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                          functions=[fn])
    m.ir_version = 8
    onnx.save(m, tmp_path / "f.onnx")
    model = load_onnx(tmp_path / "f.onnx").model
    PassManager(default_pipeline(get_target("triton-v1.12")), PassContext(verify_each=True)).run(model)
    body = [n.op_type for n in model.functions[0].body.nodes]
    assert body == ["Constant", "Add"]  # Identity removed, Constant kept
    _same_outputs(m, model, {"x": X})


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
