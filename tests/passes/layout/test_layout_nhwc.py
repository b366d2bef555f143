"""layout-nhwc: the NHWC interface gives the NCHW original's outputs on transposed inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _helpers import ort_run, zoo_params
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from mcp_compiler import CompileOptions, api
from mcp_compiler.cli import app
from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir import Layout
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.options import PipelineOptions
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.layout import LayoutNhwcPass
from mcp_compiler.pipeline import build

F = TensorProto.FLOAT
RTOL, ATOL = 1e-5, 1e-5   # only data movement changes; Conv may pick another kernel order


def _save(tmp_path, nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    return m, p


def _conv_weights(rng, cout=4, cin=3):
    return numpy_helper.from_array(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32), "w")


def _nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _run_pass(p):
    model = load_onnx(p).model
    result = LayoutNhwcPass().run(model, PassContext(verify_each=True))
    verify(result.model)
    return model, result


def test_image_input_and_output_become_nhwc(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["y"]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["v"])]
    m, p = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])],
                 [helper.make_tensor_value_info("y", F, ["N", 4, "H", "W"]),
                  helper.make_tensor_value_info("v", F, ["N", 4])], [_conv_weights(rng)])
    model, result = _run_pass(p)
    assert result.modified
    assert result.stats["inputs"] == ["x"] and result.stats["outputs"] == ["y"]
    x, (y, v) = model.graph.inputs[0], model.graph.outputs
    assert (x.name, x.type.shape, x.layout) == ("x", ("N", "H", "W", 3), Layout.NHWC)
    assert (y.name, y.type.shape, y.layout) == ("y", ("N", "H", "W", 4), Layout.NHWC)
    assert v.layout == Layout.NONE and v.type.shape == ("N", 4)   # not an image: unchanged
    feeds = {"x": rng.standard_normal((2, 3, 5, 7)).astype(np.float32)}
    want = ort_run(m, feeds)
    got = ort_run(to_onnx(model), {"x": _nhwc(feeds["x"])})
    np.testing.assert_allclose(got[0], _nhwc(want[0]), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got[1], want[1], rtol=RTOL, atol=ATOL)


def test_transposes_move_through_elementwise_ops_and_cancel(tmp_path):
    rng = np.random.default_rng(1)
    bias = numpy_helper.from_array(rng.standard_normal((1, 3, 1, 1)).astype(np.float32), "b")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Add", ["r", "b"], ["a"]),                      # constant permuted
             helper.make_node("Transpose", ["a"], ["t1"], perm=[0, 2, 3, 1]),  # the model's own
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t2", "w"], ["y"])]
    m, p = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                 [helper.make_tensor_value_info("y", F, [1, 4, 6, 6])], [bias, _conv_weights(rng)])
    model, result = _run_pass(p)
    assert result.stats["transposes_moved"] == 2
    assert result.stats["transposes_cancelled"] == 2   # ours met the model's first one
    ops = [n.op_type for n in model.graph.nodes]
    assert ops == ["Relu", "Add", "Transpose", "Conv", "Transpose"], ops
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    want = ort_run(m, feeds)[0]
    got = ort_run(to_onnx(model), {"x": _nhwc(feeds["x"])})[0]
    np.testing.assert_allclose(got, _nhwc(want), rtol=RTOL, atol=ATOL)


def test_input_already_nhwc_is_marked_not_changed(tmp_path):
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["t", "w"], ["y"])]
    _, p = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [1, 8, 8, 3])],
                 [helper.make_tensor_value_info("y", F, [1, 4, 6, 6])], [_conv_weights(rng)])
    model, result = _run_pass(p)
    assert result.stats["already_nhwc"] == ["x"] and result.stats["inputs"] == []
    assert model.graph.inputs[0].layout == Layout.NHWC
    assert result.stats["outputs"] == ["y"]   # the Conv's image output follows the input's layout


def test_non_image_input_is_left_alone(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    _, p = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4, 5])],
                 [helper.make_tensor_value_info("y", F, [2, 3, 4, 5])])
    model, result = _run_pass(p)
    assert not result.modified and result.stats["skipped"]
    assert model.graph.inputs[0].type.shape == (2, 3, 4, 5)


@pytest.mark.parametrize("path", zoo_params(), ids=lambda p: p.stem)
def test_zoo_nhwc_repository_verifies(tmp_path, path):
    r = api.compile_model(path, tmp_path / "repo", CompileOptions.for_target(
        "triton-v1.12", layout="nhwc", verify=True,
        dims={} if "det" in path.name else {"x_d2": 48}))   # rec and cls: H is unnamed
    v = r.verification
    assert v["ok"] and v["layouts"]["x"] == "NHWC", v
    config = (tmp_path / "repo" / r.output.split("/")[-1] / "config.pbtxt").read_text()
    assert "FORMAT_NHWC" in config and "max_batch_size: 8" in config
    if "det" in path.name:   # the segmentation map is an image output
        assert v["layouts"]["sigmoid_0.tmp_0"] == "NHWC"


def test_layout_flag_errors():
    r = CliRunner().invoke(app, ["convert", "--input", "m.onnx", "--output", "o.mcpir", "--layout", "nchwc"])
    assert r.exit_code == 2 and "--layout" in r.output
    with pytest.raises(Exception, match="layout-nhwc"):
        build(options=PipelineOptions(passes=["dead-code-elimination"], layout="nhwc"))
