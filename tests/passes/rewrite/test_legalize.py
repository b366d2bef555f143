"""Legalization for onnxruntime: each rule on a tiny model, numerics checked against numpy or
the op's definition, the support table against live probes, and the "no rule" diagnostic."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from _helpers import ort_run
from onnx import TensorProto as TP
from onnx import helper
from typer.testing import CliRunner

from mcp_compiler.cli import app
from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.rewrite import LegalizePass
from mcp_compiler.targets.ort_support import TABLE, SupportTable, probe

runner = CliRunner()


def _model(tmp_path, nodes, inputs, outputs, opset, name="m.onnx"):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    p = tmp_path / name
    onnx.save(m, p)
    return p


def _legalize(path):
    model = load_onnx(path).model
    r = LegalizePass(SupportTable()).run(model, PassContext())
    verify(model)
    return model, r


def _loads(proto) -> bool:
    import onnxruntime as ort

    try:
        ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.parametrize("dtype,np_dtype", [(TP.INT16, np.int16), (TP.UINT16, np.uint16)])
def test_widen_max_int16(tmp_path, dtype, np_dtype):
    p = _model(tmp_path, [helper.make_node("Max", ["a", "b"], ["y"], name="max")],
               [helper.make_tensor_value_info(n, dtype, [5]) for n in "ab"],
               [helper.make_tensor_value_info("y", dtype, [5])], 13)
    assert not _loads(onnx.load(p))          # onnxruntime has no 16-bit Max kernel
    model, r = _legalize(p)
    assert r.modified and [d["rule"] for d in r.details] == [f"widen {'int16' if dtype == TP.INT16 else 'uint16'} -> int32"]
    assert [n.op_type for n in model.graph.nodes] == ["Cast", "Cast", "Max", "Cast"]
    info = np.iinfo(np_dtype)
    a = np.array([info.min, -1 if info.min else 0, 7, info.max, 3], np_dtype)
    b = np.array([info.max, 2, 7, info.min, 4], np_dtype)
    got = ort_run(to_onnx(model), {"a": a, "b": b})[0]
    assert got.dtype == np_dtype and np.array_equal(got, np.maximum(a, b))


def test_widen_add_int8_wraps_like_int8(tmp_path):
    # ONNX integer Add is modular: widening and casting back must give the same wrapped values.
    p = _model(tmp_path, [helper.make_node("Add", ["a", "b"], ["y"], name="add")],
               [helper.make_tensor_value_info(n, TP.INT8, [4]) for n in "ab"],
               [helper.make_tensor_value_info("y", TP.INT8, [4])], 14)
    model, r = _legalize(p)
    a, b = np.array([127, -128, 100, -5], np.int8), np.array([1, -1, 100, 3], np.int8)
    got = ort_run(to_onnx(model), {"a": a, "b": b})[0]
    assert np.array_equal(got, (a.astype(np.int32) + b).astype(np.int8))   # 127+1 -> -128
    if r.modified:
        assert r.details[0]["rule"] == "widen int8 -> int32"


def test_function_body_swish(tmp_path):
    p = _model(tmp_path, [helper.make_node("Swish", ["x"], ["y"], name="swish", alpha=1.5)],
               [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3])], 24)
    # the support table says no Swish(24) kernel (probed in the SwiGLU cases, where onnxruntime
    # fails to load it); the function body is exact by definition
    model, r = _legalize(p)
    assert r.details[0]["op"] == "Swish" and r.details[0]["rule"].startswith("function body")
    assert "Swish" not in [n.op_type for n in model.graph.nodes]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = x / (1 + np.exp(-1.5 * x))
    np.testing.assert_allclose(ort_run(to_onnx(model), {"x": x})[0], want, rtol=1e-6, atol=1e-7)


def test_opset_downgrade_roialign(tmp_path):
    p = _model(tmp_path, [helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], name="roi",
                                           output_height=2, output_width=2)],
               [helper.make_tensor_value_info("x", TP.FLOAT, [1, 1, 4, 4]),
                helper.make_tensor_value_info("rois", TP.FLOAT, [1, 4]),
                helper.make_tensor_value_info("idx", TP.INT64, [1])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [1, 1, 2, 2])], 22)
    assert not _loads(onnx.load(p))
    model, r = _legalize(p)
    assert model.opset_imports[""] < 22 and r.details[0]["rule"].startswith("opset downgrade 22 ->")
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    feeds = {"x": x, "rois": np.array([[0, 0, 3, 3]], np.float32), "idx": np.array([0], np.int64)}
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(onnx.load(p)).run(None, feeds)[0]
    np.testing.assert_allclose(ort_run(to_onnx(model), feeds)[0], want, rtol=1e-5)


def test_no_downgrade_across_a_change_of_meaning(tmp_path):
    from mcp_compiler.passes.rewrite.legalize import _same_signature

    assert not _same_signature("Softmax", 13, 12)   # axis semantics changed at 13
    assert _same_signature("RoiAlign", 22, 21)


def test_supported_models_are_left_alone(tmp_path):
    p = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TP.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [2])], 17)
    model, r = _legalize(p)
    assert not r.modified and r.details == [] and r.stats["no_rule"] == 0


def test_no_rule_stops_convert_naming_the_node(tmp_path):
    p = _model(tmp_path, [helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")],
               [helper.make_tensor_value_info("x", TP.UINT64, [5]), helper.make_tensor_value_info("k", TP.INT64, [1])],
               [helper.make_tensor_value_info("v", TP.UINT64, [2]), helper.make_tensor_value_info("i", TP.INT64, [2])], 24)
    out = tmp_path / "repo"
    r = runner.invoke(app, ["convert", "-i", str(p), "-t", "triton-v1.12", "-o", str(out)])
    assert r.exit_code == 1, r.output
    assert "no kernel for and no rule makes legal: topk: TopK(24) uint64,int64->uint64,int64" in r.output
    assert not out.exists() or not any(out.iterdir())


def test_report_lists_rules_fired(tmp_path):
    p = _model(tmp_path, [helper.make_node("Min", ["a", "b"], ["y"], name="min16")],
               [helper.make_tensor_value_info(n, TP.INT16, [3]) for n in "ab"],
               [helper.make_tensor_value_info("y", TP.INT16, [3])], 13)
    rep = tmp_path / "r.json"
    r = runner.invoke(app, ["convert", "-i", str(p), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                            "--report", str(rep), "--verify"])
    assert r.exit_code == 0, r.output
    assert "original run by onnx.reference" in r.output   # onnxruntime cannot run the original
    leg = next(x for x in json.loads(rep.read_text())["passes"] if x["name"] == "legalize")
    assert leg["details"] == [{"node": "min16", "op": "Min", "opset": 13, "dtypes": "int16,int16->int16",
                               "rule": "widen int16 -> int32"}]


def test_table_is_for_this_onnxruntime_and_agrees_with_probes():
    import onnxruntime

    data = json.loads(TABLE.read_text())
    assert data["runtime"] == f"onnxruntime {onnxruntime.__version__}", \
        "rebuild: python -m mcp_compiler.targets.ort_support --build"
    k = data["kernels"]
    assert k["ai.onnx:Max:13:int16,int16->int16"] is False and k["ai.onnx:Max:13:int32,int32->int32"] is True
    # a few entries re-probed live
    for op, dt, want in [("Max", TP.INT16, False), ("Max", TP.INT32, True), ("Min", TP.UINT16, False)]:
        n = helper.make_node(op, ["a", "b"], ["y"])
        t = helper.make_tensor_type_proto(dt, [2])
        assert probe(n, [t, t], [t], {"": 13}, {}) is want
