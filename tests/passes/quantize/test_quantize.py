"""Quantization passes: numerics, lowering that onnxruntime runs exactly as dequantized, the
records of what was quantized and why not, accuracy reports and budgets."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from _helpers import ZOO_INPUTS, mlp_onnx, ort_run, zoo_params
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from mcp_compiler.cli import app
from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.quantize import QuantizeFp8Pass, QuantizeInt4Pass, QuantizeOptions
from mcp_compiler.passes.quantize.numerics import quantize_fp8, quantize_int4
from mcp_compiler.passes.rewrite import UpgradeOpsetPass

runner = CliRunner()
# The lowered model must compute exactly x @ dequantize(q): float32 accumulation-order noise only.
EXACT = dict(rtol=1e-4, atol=1e-5)


def _run_exact(model, feeds):
    """onnxruntime with float compute for DequantizeLinear+MatMul: its default fuses the pair into
    MatMulNBits with accuracy_level 4 (int8 activations), which is not x @ dequantize(q)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(to_onnx(model).SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _ops(model):
    return [n.op_type for n in model.graph.nodes]


# -- numerics -------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", [16, 32, 128])
def test_int4_asymmetric_error_is_at_most_half_a_step(block):
    w = np.random.default_rng(0).standard_normal((200, 24)).astype(np.float32)  # K not a multiple
    b = quantize_int4(w, block)
    assert b.q.shape == (24, -(-200 // block), block) and b.q.max() <= 15
    step = np.repeat(b.scale, block, axis=1)[:, :200].T
    assert np.all(np.abs(w - b.dequantize()) <= step / 2 + 1e-6)
    # the block's extremes are representable: min and max map to 0 and 15 (or zero is the edge)
    assert (b.q == 15).any() and (b.q == 0).any()


def test_int4_symmetric_maps_the_extreme_onto_minus_eight():
    w = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    b = quantize_int4(w, 32, symmetric=True)
    assert np.all(b.zero_point == 8)
    assert np.all((b.q == 0).reshape(8, 2, 32).any(-1))    # every block uses -8 (stored 0)
    assert np.abs(w - b.dequantize()).max() <= np.abs(b.scale).max()


@pytest.mark.parametrize("fmt,fmax", [("e4m3fn", 448.0), ("e5m2", 57344.0)])
@pytest.mark.parametrize("axis", [None, 1])
def test_fp8_scale_and_rounding(fmt, fmax, axis):
    w = np.random.default_rng(2).standard_normal((64, 16)).astype(np.float32) * 3
    q = quantize_fp8(w, fmt, axis)
    amax = np.abs(w).max() if axis is None else np.abs(w).max(axis=0)
    np.testing.assert_allclose(q.scale, amax / fmax, rtol=1e-6)
    assert q.q.dtype == (ml_dtypes.float8_e4m3fn if fmt == "e4m3fn" else ml_dtypes.float8_e5m2)
    assert np.isfinite(q.q.astype(np.float32)).all()
    # relative rounding error of float8: 2^-4 (e4m3, 3 mantissa bits) or 2^-3 (e5m2), plus subnormals
    rel = 2.0 ** (-4 if fmt == "e4m3fn" else -3)
    big = np.abs(w) > np.abs(w).max() / 8
    assert np.all(np.abs(w - q.dequantize())[big] <= rel * np.abs(w)[big] + 1e-7)


# -- lowering: onnxruntime computes x @ dequantize(q) ----------------------------------------------
def _mlp(tmp_path, **kw):
    p = mlp_onnx(tmp_path / "mlp.onnx", **kw)
    return p, load_onnx(p).model


def _expected(path, w1_deq, w2_deq, x):
    """The MLP with its weights replaced by the dequantized ones, in onnxruntime."""
    m = onnx.load(path)
    for t in m.graph.initializer:
        if t.name in w1_deq:
            t.CopyFrom(numpy_helper.from_array(w1_deq[t.name], t.name))
        if t.name in w2_deq:
            t.CopyFrom(numpy_helper.from_array(w2_deq[t.name], t.name))
    return ort_run(m, {"x": x})[0]


@pytest.mark.parametrize("fmt", ["matmulnbits", "qdq"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("method", ["search", "rtn"])
def test_int4_lowering_runs_exactly_the_dequantized_weights(tmp_path, fmt, symmetric, method):
    path, model = _mlp(tmp_path)
    src = onnx.load(path)
    w = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}
    opts = QuantizeOptions(mode="int4", block_size=32, symmetric=symmetric, int4_format=fmt, int4_method=method)
    if fmt == "qdq":
        UpgradeOpsetPass(21).run(model, PassContext())
    r = QuantizeInt4Pass().run(model, PassContext(quantize=opts))
    verify(model)
    assert r.modified and r.stats["quantized"] == 4 and r.stats["skipped"] == 0
    assert _ops(model).count("MatMulNBits" if fmt == "matmulnbits" else "DequantizeLinear") == 4
    assert not {"w1_0", "w2_0", "w1_1", "w2_1"} & set(model.graph.initializers)   # float weights gone
    # Gemm: transB and alpha fold into the weight, so compare against alpha * W1^T dequantized.
    deq1 = {f"w1_{i}": (quantize_int4(0.5 * w[f"w1_{i}"].T, 32, symmetric, method).dequantize().T / 0.5)
            .astype(np.float32) for i in range(2)}
    deq2 = {f"w2_{i}": quantize_int4(w[f"w2_{i}"], 32, symmetric, method).dequantize() for i in range(2)}
    x = np.random.default_rng(0).standard_normal((3, 128)).astype(np.float32)
    got = _run_exact(model, {"x": x})[0]
    np.testing.assert_allclose(got, _expected(path, deq1, deq2, x), **EXACT)
    if fmt == "matmulnbits":
        q = model.graph.initializers["w2_0_q4"].const
        assert q.dtype.name == "UINT8" and q.nbytes == 128 * 256 // 2   # two weights per byte
    else:
        q = model.graph.initializers["w2_0_q4"].const
        assert q.dtype.name == ("INT4" if symmetric else "UINT4") and q.nbytes == 128 * 256 // 2


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_fp8_lowering_runs_exactly_the_dequantized_weights(tmp_path, fmt, per_channel):
    path, model = _mlp(tmp_path, opset=19)
    src = onnx.load(path)
    w = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}
    opts = QuantizeOptions(mode="fp8", fp8_format=fmt, per_channel=per_channel)
    r = QuantizeFp8Pass().run(model, PassContext(quantize=opts))
    verify(model)
    assert r.modified and r.stats["quantized"] == 4
    axis = 1 if per_channel else None
    deq1 = {f"w1_{i}": (quantize_fp8(0.5 * w[f"w1_{i}"].T, fmt, axis).dequantize().T / 0.5).astype(np.float32)
            for i in range(2)}
    deq2 = {f"w2_{i}": quantize_fp8(w[f"w2_{i}"], fmt, axis).dequantize() for i in range(2)}
    x = np.random.default_rng(0).standard_normal((3, 128)).astype(np.float32)
    np.testing.assert_allclose(_run_exact(model, {"x": x})[0], _expected(path, deq1, deq2, x), **EXACT)
    q = model.graph.initializers["w2_0_f8"].const
    assert q.dtype.name == ("FLOAT8E4M3FN" if fmt == "e4m3fn" else "FLOAT8E5M2") and q.nbytes == 128 * 256


def test_fp8_refuses_an_old_opset(tmp_path):
    _, model = _mlp(tmp_path, opset=17)
    with pytest.raises(ValueError, match="opset >= 19"):
        QuantizeFp8Pass().run(model, PassContext(quantize=QuantizeOptions(mode="fp8")))


def _conv_model(tmp_path, c=64, m=32):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((m, c, 3, 3)) * 0.1).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, 8, 8])],
                          [numpy_helper.from_array(w, "w")])
    mp = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    mp.ir_version = 10
    onnx.save(mp, tmp_path / "conv.onnx")
    return mp, w


@pytest.mark.parametrize("mode", ["int4", "fp8"])
def test_conv_weights_with_quantize_conv(tmp_path, mode):
    mp, w = _conv_model(tmp_path)
    model = load_onnx(tmp_path / "conv.onnx").model
    opts = QuantizeOptions(mode=mode, int4_format="qdq", conv=True)
    p = QuantizeInt4Pass() if mode == "int4" else QuantizeFp8Pass()
    r = p.run(model, PassContext(quantize=opts))
    assert r.stats["quantized"] == 1 and _ops(model) == ["DequantizeLinear", "Conv"]
    if mode == "int4":   # blocks of 32 along the input channels
        kn = np.moveaxis(w, 1, -1).reshape(-1, 64).T
        deq = np.moveaxis(quantize_int4(kn, 32, method=opts.int4_method).dequantize().T.reshape(32, 3, 3, 64), -1, 1)
    else:
        deq = quantize_fp8(w, "e4m3fn", 0).dequantize()
    x = np.random.default_rng(1).standard_normal((1, 64, 8, 8)).astype(np.float32)
    ref = mp.__deepcopy__()
    ref.graph.initializer[0].CopyFrom(numpy_helper.from_array(deq.astype(np.float32), "w"))
    np.testing.assert_allclose(_run_exact(model, {"x": x})[0], ort_run(ref, {"x": x})[0], **EXACT)


def test_conv_is_skipped_without_the_flag_and_says_why(tmp_path):
    _conv_model(tmp_path)
    model = load_onnx(tmp_path / "conv.onnx").model
    r = QuantizeInt4Pass().run(model, PassContext(quantize=QuantizeOptions()))
    assert not r.modified and r.stats["quantized"] == 0
    assert r.details[0]["reason"] == "Conv weights are quantized only with --quantize-conv"
    r = QuantizeInt4Pass().run(model, PassContext(quantize=QuantizeOptions(conv=True)))
    assert not r.modified and "needs --int4-format qdq" in r.details[0]["reason"]


def test_skip_reasons(tmp_path):
    path, model = _mlp(tmp_path)
    opts = QuantizeOptions(exclude=["fc1_*"], max_error=0.05, int4_method="rtn")
    r = QuantizeInt4Pass().run(model, PassContext(quantize=opts))
    reasons = {d["node"]: d["reason"] for d in r.details}
    assert reasons["fc1_0"] == reasons["fc1_1"] == "excluded by --quantize-exclude fc1_*"
    assert reasons["fc2_0"].startswith("relative weight error 0.08") and "> --quantize-max-error 0.05" in reasons["fc2_0"]
    assert not r.modified
    _, model = _mlp(tmp_path)
    r = QuantizeInt4Pass().run(model, PassContext(quantize=QuantizeOptions(min_elements=10**6)))
    assert not r.modified and all(d["reason"].startswith("too small (32768 elements") for d in r.details)


def test_activation_weights_are_not_constant(tmp_path):
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 64]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    r = QuantizeInt4Pass().run(load_onnx(tmp_path / "m.onnx").model, PassContext(quantize=QuantizeOptions()))
    assert not r.modified and r.details == [{"node": "mm", "op": "MatMul", "weight": "b", "action": "skipped",
                                             "reason": "weight is not a constant"}]


# -- upgrade-opset ---------------------------------------------------------------------------------
@pytest.mark.parametrize("src", zoo_params(), ids=lambda p: p.name)
def test_upgrade_opset_keeps_outputs(src):
    from mcp_compiler.passes.normalize import ConstantToInitializerPass

    model = load_onnx(src).model
    ConstantToInitializerPass().run(model, PassContext())
    before = {k: v.const for k, v in model.graph.initializers.items() if v.const.nbytes > 1024}
    r = UpgradeOpsetPass(21).run(model, PassContext())
    verify(model)
    assert r.modified and model.opset_imports[""] == 21
    for name, t in before.items():   # the same bytes, not copies
        after = model.graph.initializers[name].const
        assert np.shares_memory(np.frombuffer(t.raw, np.uint8), np.frombuffer(after.raw, np.uint8)), name
    x = np.random.default_rng(0).random(ZOO_INPUTS[src.name], dtype=np.float32)
    for a, b in zip(ort_run(src, {"x": x}), ort_run(to_onnx(model), {"x": x})):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_upgrade_opset_is_a_no_op_when_new_enough(tmp_path):
    _, model = _mlp(tmp_path, opset=19)
    assert not UpgradeOpsetPass(19).run(model, PassContext()).modified


# -- through the CLI: report, accuracy, budget -----------------------------------------------------
def _cli(*args):
    return runner.invoke(app, ["convert", *args])


def test_cli_int4_report_and_accuracy(tmp_path):
    path = mlp_onnx(tmp_path / "mlp.onnx")
    out, rep = tmp_path / "q.mcpir", tmp_path / "report.json"
    r = _cli("-i", str(path), "-o", str(out), "--quantize", "int4", "--report", str(rep))
    assert r.exit_code == 0, r.output
    assert "quantized int4: 4 weights, 0 skipped" in r.output and "cosine 0.99" in r.output
    q = json.loads(rep.read_text())["quantization"]
    assert q["mode"] == "int4" and len(q["quantized"]) == 4 and q["weight_bytes_after"] < 0.2 * q["weight_bytes_before"]
    acc = q["accuracy"]
    assert acc["ok"] and acc["samples"] == 16 and acc["outputs"][0]["cosine"] > 0.99
    assert 0 < acc["outputs"][0]["max_abs"] < 0.01 and acc["outputs"][0]["top1_agreement"] is not None


def test_cli_accuracy_budget_fails_and_writes_nothing(tmp_path):
    path = mlp_onnx(tmp_path / "mlp.onnx")
    repo = tmp_path / "repo"
    r = _cli("-i", str(path), "-t", "triton-v1.12", "-o", str(repo), "--quantize", "int4",
             "--accuracy-budget", "cos=0.9999999", "--no-auto-exclude")
    assert r.exit_code == 1 and "outside --accuracy-budget" in r.output and "cosine 0.99" in r.output
    assert not repo.exists() or not any(repo.iterdir())
    # with layer selection (the default with a budget): no selection holds it either, and it says so
    r = _cli("-i", str(path), "-t", "triton-v1.12", "-o", str(repo), "--quantize", "int4",
             "--accuracy-budget", "cos=0.9999999")
    assert r.exit_code == 1 and "no selection of quantized layers holds --accuracy-budget" in r.output
    assert "the least sensitive alone" in r.output and "nothing was written" in r.output
    assert not repo.exists() or not any(repo.iterdir())
    r = _cli("-i", str(path), "-t", "triton-v1.12", "-o", str(repo), "--quantize", "fp8",
             "--accuracy-budget", "cos=0.99,max-abs=0.01")
    assert r.exit_code == 0, r.output
    assert (repo / "mlp" / "1" / "model.mcpir").exists()


@pytest.mark.parametrize("flags,message", [
    (["--quantize", "int3"], "expected one of none, int4, fp8, fp16, bf16, int8"),
    (["--quantize", "int4", "--int4-method", "gptq"], "--int4-method: expected search or rtn"),
    (["--quantize", "int4", "--group-size", "48"], "--group-size: expected one of"),
    (["--quantize", "int4", "--accuracy-budget", "cosine=1"], "KEY one of cos, max-abs, rel, top1"),
    (["--quantize", "int4", "--accuracy-budget", "cos=high"], "'high' is not a number"),
    (["--accuracy-budget", "cos=0.9"], "need --quantize"),
    (["--quantize", "fp8", "--fp8-format", "e3m4"], "--fp8-format"),
])
def test_cli_bad_quantize_flags(tmp_path, flags, message):
    path = mlp_onnx(tmp_path / "mlp.onnx")
    r = _cli("-i", str(path), "-o", str(tmp_path / "q.mcpir"), *flags)
    assert r.exit_code == 2 and message in r.output, r.output
    assert not (tmp_path / "q.mcpir").exists()


def test_cli_calibration_data_quantizes_activations(tmp_path):
    path = mlp_onnx(tmp_path / "mlp.onnx")
    cal = tmp_path / "cal"
    cal.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.savez(cal / f"s{i}.npz", x=rng.standard_normal((4, 128)).astype(np.float32))
    rep = tmp_path / "r.json"
    r = _cli("-i", str(path), "-o", str(tmp_path / "q.mcpir"), "--quantize", "fp8",
             "--calibration-data", str(cal), "--report", str(rep))
    assert r.exit_code == 0, r.output
    report = json.loads(rep.read_text())
    fp8 = next(p for p in report["passes"] if p["name"] == "quantize-fp8")
    assert fp8["stats"]["activations_quantized"] == 4
    assert report["quantization"]["accuracy"]["inputs"].endswith("(3 samples)")
    # static per-tensor E4M3 activations cost more than the weights alone (0.9997 on this model)
    assert report["quantization"]["accuracy"]["outputs"][0]["cosine"] > 0.98
    from mcp_compiler.mcpir.reader import read_mcpir

    assert [n.op_type for n in read_mcpir(tmp_path / "q.mcpir").graph.nodes].count("QuantizeLinear") == 4


def test_cli_bad_calibration_data(tmp_path):
    path = mlp_onnx(tmp_path / "mlp.onnx")
    cal = tmp_path / "cal"
    cal.mkdir()
    np.savez(cal / "s0.npz", y=np.zeros((1, 128), np.float32))
    r = _cli("-i", str(path), "-o", str(tmp_path / "q.mcpir"), "--quantize", "fp8", "--calibration-data", str(cal))
    assert r.exit_code == 2 and "s0.npz: missing input x; no model input named y" in r.output
    (cal / "s0.npz").write_bytes(b"not a zip")
    r = _cli("-i", str(path), "-o", str(tmp_path / "q.mcpir"), "--quantize", "fp8", "--calibration-data", str(cal))
    assert r.exit_code == 2 and "not a readable .npz" in r.output
    assert not (tmp_path / "q.mcpir").exists()


@pytest.mark.parametrize("src", zoo_params("rec"), ids=lambda p: p.name)
def test_zoo_recognition_model_quantizes_where_ort_finds_nothing(tmp_path, src):
    # onnxruntime's quantizers find no initializer weight here (MatMul weights are Constant
    # nodes): our normalization turns them into initializers first.
    rep = tmp_path / "r.json"
    r = _cli("-i", str(src), "-o", str(tmp_path / "q.mcpir"), "--quantize", "int4", "--report", str(rep),
             "--quantize-min-elements", "1024", "--dims", "p2o.DynamicDimension.0=1,?=48,p2o.DynamicDimension.1=320")
    assert r.exit_code == 0, r.output
    q = json.loads(rep.read_text())["quantization"]
    assert len(q["quantized"]) == 9
    acc = q["accuracy"]["outputs"][0]
    assert acc["cosine"] > 0.98 and acc["top1_agreement"] > 0.9
