"""`mcp-cli passes` reads a catalogue (no numpy/onnx import); it must say what the passes say."""

from __future__ import annotations

import subprocess
import sys

from mcp_compiler.pass_catalog import CATALOG, from_passes


def test_catalog_matches_the_passes():
    assert CATALOG == from_passes(), "stale: run `python -m mcp_compiler.pass_catalog`"


def test_passes_command_imports_no_numpy_onnx_or_onnxruntime():
    code = ("import sys; from mcp_compiler.cli import main; sys.argv = ['mcp-cli', 'passes', '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print([m for m in ('numpy', 'onnx', 'onnxruntime', 'flatbuffers') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
