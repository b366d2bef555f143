"""`-o out.onnx`: the optimized model as ONNX (the `onnx` target)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from _helpers import GOLDEN, golden_dirs
from typer.testing import CliRunner

from mcp_compiler.cli import app

runner = CliRunner()


def _run(path, feeds):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("folder", golden_dirs(), ids=lambda p: p.name)
def test_onnx_output_keeps_outputs_opset_and_ir_version(folder, tmp_path):
    out = tmp_path / "out.onnx"
    r = runner.invoke(app, ["convert", str(folder / "model.onnx"), "-o", str(out), "--verify", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["ok"] and report["output"] == str(out) and report["files"] == ["out.onnx"]
    assert report["verification"]["ok"]
    before, after = onnx.load(folder / "model.onnx"), onnx.load(out)
    onnx.checker.check_model(after, full_check=True)
    assert after.ir_version == before.ir_version
    assert {o.domain: o.version for o in after.opset_import} == {o.domain: o.version for o in before.opset_import}
    feeds = dict(np.load(folder / "inputs.npz"))
    for a, b in zip(_run(folder / "model.onnx", feeds), _run(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    assert len(after.graph.node) <= len(before.graph.node)


def test_external_data_and_replacing(tmp_path):
    mlp = GOLDEN / "mlp" / "model.onnx"
    out = tmp_path / "m.onnx"
    r = runner.invoke(app, ["convert", str(mlp), "-o", str(out), "--external-data"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "m.onnx.data").stat().st_size > 0
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.load(out, load_external_data=False).graph.initializer)
    feeds = dict(np.load(GOLDEN / "mlp" / "inputs.npz"))
    np.testing.assert_allclose(_run(out, feeds)[0], _run(mlp, feeds)[0], rtol=1e-5, atol=1e-6)
    r = runner.invoke(app, ["convert", str(mlp), "-o", str(out)])
    assert r.exit_code == 2 and "exists; pass --force" in r.stderr
    r = runner.invoke(app, ["convert", str(mlp), "-o", str(out), "--force"])
    assert r.exit_code == 0 and not (tmp_path / "m.onnx.data").exists()   # the old data went with it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]        # no temp files left


@pytest.mark.parametrize("args, message", [
    (["-o", "{d}/m.txt"], "expected a file named *.mcpir (MCP-IR) or *.onnx"),
    (["-o", "{d}/m.onnx", "--max-batch-size", "4"], "--max-batch-size is not a setting of the ONNX output"),
    (["-o", "{d}/m.mcpir", "--external-data"], "--external-data needs --target"),
    (["-t", "triton-v1.12", "-o", "{d}/m.onnx"], "--output is the model repository folder"),
])
def test_bad_outputs(tmp_path, args, message):
    r = runner.invoke(app, ["convert", str(GOLDEN / "mlp" / "model.onnx"), *[a.format(d=tmp_path) for a in args]])
    assert r.exit_code == 2 and message in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_zoo_emits_onnx(tmp_path):
    shutil.copy(GOLDEN / "mlp" / "model.onnx", tmp_path / "mlp.onnx")
    (tmp_path / "zoo.yaml").write_text("models:\n  - name: mlp\n    source: {path: mlp.onnx}\n    target: onnx\n")
    r = runner.invoke(app, ["zoo", str(tmp_path / "zoo.yaml"), "-o", str(tmp_path / "out"), "-j", "1",
                            "--cache", str(tmp_path / "cache"), "--verify"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["mlp.onnx"]
    onnx.checker.check_model(onnx.load(tmp_path / "out" / "mlp.onnx"))


def test_build_file_with_the_onnx_output(tmp_path):
    """--config reads the target's own settings (an internal error before: only Triton had a loader)."""
    mlp = GOLDEN / "mlp" / "model.onnx"
    (tmp_path / "b.yaml").write_text("external_data: true\n")
    r = runner.invoke(app, ["convert", str(mlp), "-o", str(tmp_path / "m.onnx"), "--config", str(tmp_path / "b.yaml")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "m.onnx.data").exists()
    (tmp_path / "c.yaml").write_text("max_batch_size: 4\n")
    r = runner.invoke(app, ["convert", str(mlp), "-o", str(tmp_path / "n.onnx"), "--config", str(tmp_path / "c.yaml")])
    assert r.exit_code == 2 and "line 1: unknown key 'max_batch_size' (known: external_data, quantization_level, initializer_inputs)" in r.stderr
