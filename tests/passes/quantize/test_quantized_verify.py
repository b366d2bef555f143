"""Issue 30, items 6-8: a quantized model is verified by its accuracy budget (not float32
tolerances), the accuracy report runs on 16 samples and judges the worst one, a result under the
level's default budget warns, and weights that are already compressed are named for what they are."""

from __future__ import annotations

import json

import numpy as np
import onnx
from _helpers import GOLDEN
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from mcp_compiler.cli import app

runner = CliRunner()


def test_fp16_convert_verify_passes_within_its_budget(tmp_path):
    r = runner.invoke(app, ["convert", str(GOLDEN / "convnet" / "model.onnx"), "-t", "triton-v1.12", "-o",
                            str(tmp_path / "repo"), "--quantize", "fp16", "--quantize-min-elements", "16",
                            "--verify", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    v = out["verification"]
    assert v["ok"] and v["budget"] == {"cos": 0.999, "rel": 0.02} and v["samples"] == 16
    assert out["quantization"]["accuracy"]["samples"] == 16
    acc = out["quantization"]["accuracy"]["outputs"][0]
    assert acc["cosine"] <= acc["cosine_all"] + 1e-12   # the worst sample, not the pooled figure


def test_under_the_default_budget_warns_without_a_budget():
    from mcp_compiler.accuracy import AccuracyReport, OutputAccuracy, default_budget, under_default

    rep = AccuracyReport("random (16 samples)", 16, [OutputAccuracy("y", 0.3, 0.1, 0.975, None, 0.99)])
    warned = under_default(rep, "int4")
    assert len(warned) == 1 and "cosine 0.975 < cos=0.98, outside the default int4 budget" in warned[0], warned
    assert under_default(rep, "fp8") and not under_default(AccuracyReport("r", 16, [OutputAccuracy("y", 0, 0, 0.99995)]), "fp16")
    assert default_budget("none") == {} and default_budget("bf16") == {"cos": 0.999, "rel": 0.05}


def _model(tmp_path, kind: str):
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    if kind == "fp16":
        nodes, inits = [helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT)], [numpy_helper.from_array(w.astype(np.float16), "w16")]
    else:
        q = np.clip(np.round(w / 0.02), -127, 127).astype(np.int8)
        nodes = [helper.make_node("DequantizeLinear", ["wq", "s"], ["w"])]
        inits = [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(np.array(0.02, np.float32), "s")]
    g = helper.make_graph([*nodes, helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])], inits)
    path = tmp_path / f"{kind}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_already_compressed_weights_are_named(tmp_path):
    for kind, says in (("fp16", "float16 weights: nothing to do"), ("int8", "int8 QDQ weights: already quantized")):
        r = runner.invoke(app, ["convert", str(_model(tmp_path, kind)), "-t", "triton-v1.12", "-o", str(tmp_path / kind),
                                "--quantize", "int4", "--quantize-min-elements", "16", "--json"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        assert out["quantization"]["skipped"][0]["reason"] == says
        assert any(says in w for w in out["warnings"]) and not any("not a constant" in w for w in out["warnings"])


def test_an_engines_budget_counts_outputs_within_atol_as_equal_whatever_their_cosine():
    """A detector's map at a small size holds probabilities of 1e-7: another engine differs there by
    9e-8 and the cosine says 0.53. For an engine or precision change, within atol everywhere is equal
    (as the runtime profile counts it); past atol, or for a quantization, the budget judges."""
    from mcp_compiler.reference import VerifyReport, _compare_all

    want = np.array([[1e-7, 2e-7, 1.5e-7]], np.float32)
    tiny = np.array([[2e-7, 0.5e-7, 1.5e-7]], np.float32)       # cosine ~0.7, max abs 1.5e-7

    def judged(got, ref, engine=True):
        report = VerifyReport("r", "python", 1, {}, 1e-3, 1e-4)
        report.budget, report.atol_equal = {"cos": 0.999, "rel": 0.05}, engine
        _compare_all(report, lambda feeds: [got], [{"x": np.zeros(1)}], ["y"], [[ref]])
        return report.outputs[0]
    assert judged(tiny, want).ok and judged(tiny, want).cosine < 0.9
    assert not judged(tiny * 1e4, want * 1e4).ok   # the same disagreement at a size atol does not cover
    assert not judged(tiny, want, engine=False).ok   # a quantization's budget judges even tiny outputs
