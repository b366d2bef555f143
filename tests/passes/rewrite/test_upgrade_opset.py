"""The upgrade-opset (--opset first, so that the fusions fire) pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
from _fusion_cases import ATOL, RTOL, _layernorm_nodes, _ops, _save, rng
from _helpers import ort_run
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.lower import to_onnx


def test_opset_flag_upgrades_first_so_the_fusions_fire(tmp_path):
    # an opset-13 layer norm with the exported GELU after it: --opset 20 gives both fused ops
    import json

    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    nodes, inits = _layernorm_nodes(13)
    c = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    nodes[-1] = helper.make_node("Add", ["ng", "beta"], ["ln"])
    nodes += [helper.make_node("Div", ["ln", "s2"], ["a"]), helper.make_node("Erf", ["a"], ["er"]),
              helper.make_node("Add", ["er", "one"], ["b"]), helper.make_node("Mul", ["ln", "b"], ["xb"]),
              helper.make_node("Mul", ["xb", "half"], ["y"])]
    inits += [c(np.sqrt(2), "s2"), c(1.0, "one"), c(0.5, "half")]
    m = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 5, 16])],
              [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 5, 16])], inits, opset=13)
    runner = CliRunner()
    r = runner.invoke(app, ["convert", "-i", str(tmp_path / "m.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                            "--opset", "20", "--json", "--verify", "--dims", "N=2"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["nodes"] == 2
    from mcp_compiler.mcpir import read_mcpir

    model = read_mcpir(tmp_path / "repo" / "m" / "1" / "model.mcpir")
    assert _ops(model) == ["LayerNormalization", "Gelu"]
    feeds = {"x": rng.standard_normal((2, 5, 16)).astype(np.float32)}
    np.testing.assert_allclose(ort_run(to_onnx(model), feeds)[0], ort_run(m, feeds)[0], rtol=RTOL, atol=ATOL)
