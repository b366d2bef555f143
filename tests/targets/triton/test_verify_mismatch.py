"""`verify MODEL DIR/OTHER`: an entry converted from another model is a usage error (exit 2)
naming the inputs and outputs that differ, not an internal error."""

from __future__ import annotations

import subprocess
import sys

from _helpers import GOLDEN

from mcp_compiler import CompileOptions, compile_model


def test_verify_of_an_entry_from_another_model_is_a_usage_error(tmp_path):
    compile_model(GOLDEN / "mlp" / "model.onnx", tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "mlp"))
    r = subprocess.run([sys.executable, "-m", "mcp_compiler.cli", "verify", str(GOLDEN / "convnet" / "model.onnx"),
                        str(tmp_path / "repo" / "mlp")], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "do not match" in r.stderr, r.stderr
    assert "the entry has output(s) 'y' the model does not" in r.stderr and "lacks output(s)" in r.stderr
