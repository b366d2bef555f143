"""INT4 scale search, layer selection for a budget, FP16/BF16 weights, dequantize at load."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from _helpers import ort_run
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from mcp_compiler.cli import app
from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.quantize import QuantizeHalfPass, QuantizeOptions
from mcp_compiler.passes.quantize.numerics import quantize_int4


def _stack(path, layers: int = 4, d: int = 256, seed: int = 0, wide_input: bool = False):
    """MatMul + Relu x layers, plus a LayerNorm-style scale vector read by Mul (quantizable) and
    a Pow exponent (kept float32); x: [n, d]."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((d, d)).astype(np.float32) * 0.05
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    inits.append(numpy_helper.from_array(np.full((d,), 2.0, np.float32), "p"))
    nodes.append(helper.make_node("Pow", [x, "p"], ["y"], name="pow"))
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", d])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _cli(*args):
    return CliRunner().invoke(app, ["convert", *args])


def _cos(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# -- INT4: the search ---------------------------------------------------------------------------

@pytest.mark.parametrize("symmetric", [False, True])
def test_search_beats_round_to_nearest_on_every_layer(symmetric):
    rng = np.random.default_rng(1)
    for shape in ((256, 128), (100, 64), (512, 32)):          # 100: K padded to whole blocks
        w = (rng.standard_normal(shape) * rng.uniform(0.01, 0.1)).astype(np.float32)
        rtn = quantize_int4(w, 32, symmetric, "rtn")
        found = quantize_int4(w, 32, symmetric, "search")
        assert found.rel_error < rtn.rel_error * 0.97, (shape, found.rel_error, rtn.rel_error)
        # rel_error is what dequantize() gives back, and the integers are in range
        deq = found.dequantize()
        assert deq.shape == w.shape
        assert abs(np.linalg.norm(deq - w) / np.linalg.norm(w) - found.rel_error) < 1e-5
        assert found.q.max() <= 15 and found.zero_point.max() <= 15


def test_search_weighted_by_the_input_follows_the_heavy_channels():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((256, 64)).astype(np.float32) * 0.05
    scale = np.exp(2 * rng.standard_normal(256)).astype(np.float32)     # a few channels dominate
    x = rng.standard_normal((512, 256)).astype(np.float32) * scale
    y = x @ w
    plain = quantize_int4(w, 32, method="search")
    aware = quantize_int4(w, 32, method="search", importance=(x ** 2).mean(axis=0))
    assert 1 - _cos(y, x @ aware.dequantize()) < 0.8 * (1 - _cos(y, x @ plain.dequantize()))


def test_calibration_data_weights_the_search_and_the_report_says_so(tmp_path):
    src = _stack(tmp_path / "m.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(3)
    for i in range(2):
        np.savez(calib / f"{i}.npz", x=rng.standard_normal((4, 256)).astype(np.float32))
    out = tmp_path / "q.onnx"
    r = _cli(str(src), "-o", str(out), "--quantize", "int4", "--calibration-data", str(calib), "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["quantization"]["quantized"]
    assert len(rows) == 4 and {row["method"] for row in rows} == {"search+activations"}
    assert all(row["rel_error"] < row["rel_error_rtn"] * 1.2 for row in rows)


# -- layer selection -----------------------------------------------------------------------------

def test_budget_keeps_the_fewest_most_sensitive_layers(tmp_path):
    src = _stack(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    free = _cli(str(src), "-o", str(out), "--quantize", "int4", "--json")
    cos_all = json.loads(free.output)["quantization"]["accuracy"]["outputs"][0]["cosine"]
    budget = 1 - (1 - cos_all) / 2.5            # about two layers' worth of error too much
    r = _cli(str(src), "-o", str(out), "--quantize", "int4", "--accuracy-budget", f"cos={budget:.6f}",
             "--json", "--force")
    assert r.exit_code == 0, r.output
    q = json.loads(r.output)["quantization"]
    sel = q["selection"]
    assert 1 <= len(sel["kept"]) < 4 and sel["holds"]
    # the kept ones are the most sensitive, and the rest are quantized
    ranked = list(sel["sensitivity"])
    assert sel["kept"] == ranked[:len(sel["kept"])]
    assert {row["weight"] for row in q["quantized"]} == set(ranked[len(sel["kept"]):])
    assert q["accuracy"]["outputs"][0]["cosine"] >= budget
    # and the file runs as the report says
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    assert _cos(ort_run(src, {"x": x})[0], ort_run(out, {"x": x})[0]) > cos_all


def test_budget_that_no_selection_meets_names_the_best_and_writes_nothing(tmp_path):
    src = _stack(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    r = _cli(str(src), "-o", str(out), "--quantize", "int4", "--accuracy-budget", "cos=0.99999999")
    assert r.exit_code == 1
    assert "no selection of quantized layers holds --accuracy-budget cos=0.99999999" in r.output
    assert "the least sensitive alone (w" in r.output and not out.exists()


# -- FP16 / BF16 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,np_type", [("fp16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_half_weights_halve_the_file_keep_float32_compute_and_the_interface(tmp_path, mode, np_type):
    src = _stack(tmp_path / "m.onnx")
    out = tmp_path / "q.onnx"
    r = _cli(str(src), "-o", str(out), "--quantize", mode, "--quantize-min-elements", "16", "--json")
    assert r.exit_code == 0, r.output
    q = json.loads(r.output)["quantization"]
    assert len(q["quantized"]) == 4 and q["compression"] > 1.95
    assert any("read by Pow" in row["reason"] for row in q["skipped"])      # the exponent stays float32
    m = onnx.load(out)
    inits = {t.name: t for t in m.graph.initializer}
    half = TensorProto.FLOAT16 if mode == "fp16" else TensorProto.BFLOAT16
    assert sum(t.data_type == half for t in inits.values()) == 4 and inits["p"].data_type == TensorProto.FLOAT
    assert [i.type.tensor_type.elem_type for i in [*m.graph.input, *m.graph.output]] == [TensorProto.FLOAT] * 2
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    got, want = ort_run(out, {"x": x})[0], ort_run(src, {"x": x})[0]
    assert got.dtype == np.float32 and _cos(got, want) > 0.9999
    # exactly float32 compute on the rounded weights
    w = {t.name: numpy_helper.to_array(t) for t in onnx.load(src).graph.initializer}
    ref = onnx.load(src)
    for t in ref.graph.initializer:
        if t.name.startswith("w"):
            t.CopyFrom(numpy_helper.from_array(w[t.name].astype(np_type).astype(np.float32), t.name))
    np.testing.assert_allclose(got, ort_run(ref, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_half_keeps_values_beyond_its_range_in_float32(tmp_path):
    src = _stack(tmp_path / "m.onnx")
    m = onnx.load(src)
    w0 = numpy_helper.to_array(m.graph.initializer[0]).copy()
    w0[0, 0] = 1e6                                    # beyond float16's 65504
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(w0, "w0"))
    model = load_onnx_model(m, tmp_path)
    r = QuantizeHalfPass().run(model, PassContext(quantize=QuantizeOptions(mode="fp16")))
    verify(model)
    rows = {row["weight"]: row for row in r.details}
    assert rows["w0"]["action"] == "skipped" and "beyond fp16's range" in rows["w0"]["reason"]
    assert model.graph.initializers["w0"].const.dtype.name == "FLOAT"
    assert r.stats["quantized"] == 3


def load_onnx_model(m, tmp_path):
    p = tmp_path / "x.onnx"
    onnx.save(m, p)
    return load_onnx(p).model


# -- the Triton target: dequantize at load -------------------------------------------------------

def test_fp8_on_cpu_dequantizes_at_load_by_default(tmp_path):
    from mcp_compiler.targets.triton.verify import load_runtime

    src = _stack(tmp_path / "m.onnx")
    repo = tmp_path / "repo"
    r = _cli(str(src), "-t", "triton-v1.12", "-o", str(repo), "--quantize", "fp8")
    assert r.exit_code == 0, r.output
    assert "dequantizes its quantized weights once at load" in r.output
    cfg = (repo / "m" / "config.pbtxt").read_text()
    assert 'key: "ort_dequantize_at_load"' in cfg
    entry = repo / "m" / "1" / "model.mcpir"
    MCPIRModel = load_runtime(repo / "m" / "1").MCPIRModel
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    folded = MCPIRModel(entry, dequantize_at_load=True).run({"x": x})[0]
    per_run = MCPIRModel(entry).run({"x": x})[0]
    np.testing.assert_allclose(folded, per_run, rtol=1e-5, atol=1e-6)
    r = _cli(str(src), "-t", "triton-v1.12", "-o", str(repo), "--quantize", "fp8", "--no-dequantize-at-load",
             "--force")
    assert r.exit_code == 0, r.output
    assert "ort_dequantize_at_load" not in (repo / "m" / "config.pbtxt").read_text()
    # nothing to dequantize: no setting, no message
    r = _cli(str(src), "-t", "triton-v1.12", "-o", str(repo), "--quantize", "fp16", "--force")
    assert r.exit_code == 0 and "at load" not in r.output
