"""The command line as a user runs it: exit codes, --json, --version, help, atomic outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from _helpers import GOLDEN, ort_run
from typer.testing import CliRunner

from mcp_compiler import __version__
from mcp_compiler.cli import app
from mcp_compiler.lower import to_onnx
from mcp_compiler.mcpir import read_mcpir

runner = CliRunner()
MLP = GOLDEN / "mlp" / "model.onnx"


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"mcp-cli {__version__}"


def test_help_lists_commands_and_exit_codes():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for word in ("convert", "inspect", "Exit codes"):
        assert word in r.output


def test_convert_then_inspect(tmp_path):
    out = tmp_path / "mlp.mcpir"
    r = runner.invoke(app, ["convert", "--input", str(MLP), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and out.exists()
    inputs = dict(np.load(GOLDEN / "mlp" / "inputs.npz"))
    np.testing.assert_array_equal(ort_run(MLP, inputs)[0], ort_run(to_onnx(read_mcpir(out)), inputs)[0])
    r = runner.invoke(app, ["inspect", str(out)])
    assert r.exit_code == 0
    assert "x: float [N, 16]" in r.output and "Gemm 1" in r.output and "symbols: N" in r.output


def test_json_outputs(tmp_path):
    out = tmp_path / "mlp.mcpir"
    r = runner.invoke(app, ["convert", "-i", str(MLP), "-o", str(out), "--json"])
    rep = json.loads(r.output)
    assert rep["ok"] and rep["nodes"] == 5 and rep["weights"] == 4
    assert rep["weight_bytes"] == 4 * (32 * 16 + 32 + 32 * 10 + 10)
    for src, fmt in ((MLP, "onnx"), (out, "mcpir")):
        s = json.loads(runner.invoke(app, ["inspect", str(src), "--json"]).output)
        assert s["format"] == fmt
        assert s["inputs"] == [{"name": "x", "type": "tensor(float[N,16])", "layout": "NONE",
                                "dtype": "float", "shape": ["N", 16]}]
        assert s["op_histogram"] == {"Gemm": 1, "Relu": 1, "MatMul": 1, "Add": 1, "Softmax": 1}
        assert s["weight_bytes_by_dtype"] == {"float": rep["weight_bytes"]}
        assert s["opsets"] == {"": 17}


def test_json_error(tmp_path):
    r = runner.invoke(app, ["inspect", str(tmp_path / "nope.onnx"), "--json"])
    assert r.exit_code == 2
    assert json.loads(r.stdout)["ok"] is False


def test_usage_errors_exit_2(tmp_path):
    assert runner.invoke(app, ["convert", "--input", str(MLP)]).exit_code == 2  # no --output
    assert runner.invoke(app, ["frobnicate"]).exit_code == 2
    r = runner.invoke(app, ["convert", "-i", str(MLP), "-o", str(tmp_path / "x.txt")])   # .onnx is an output now
    assert r.exit_code == 2 and "expected a file named *.mcpir (MCP-IR) or *.onnx" in r.output
    r = runner.invoke(app, ["convert", "-i", str(MLP), "-o", str(tmp_path / "no" / "x.mcpir")])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_overwrite_is_atomic(tmp_path):
    out = tmp_path / "m.mcpir"
    assert runner.invoke(app, ["convert", "-i", str(MLP), "-o", str(out)]).exit_code == 0
    before = out.read_bytes()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    assert runner.invoke(app, ["convert", "-i", str(bad), "-o", str(out)]).exit_code == 2
    assert out.read_bytes() == before  # the failed convert did not touch the old output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx", "m.mcpir"]


def test_console_script_runs(tmp_path):
    # The installed entry point, in a fresh process: what a user types.
    exe = [sys.executable, "-m", "mcp_compiler.cli"]
    r = subprocess.run([*exe, "convert", "-i", str(MLP), "-o", str(tmp_path / "m.mcpir")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*exe, "inspect", str(tmp_path / "nothing.onnx")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_console_script_skips_the_teardown_but_not_the_exit_handlers(tmp_path):
    """entry() ends the process with os._exit after main(): the exit code stays main's, piped
    output is all there, and atexit handlers (logging, telemetry) still run."""
    code = ("import atexit, sys; sys.argv = ['mcp-cli', *sys.argv[1:]]\n"
            "atexit.register(lambda: print('handler ran', file=sys.stderr))\n"
            "class Torn:\n    def __del__(self): print('torn down', file=sys.stderr)\n"
            "kept = Torn()   # freed by the interpreter's teardown, which entry() skips\n"
            "from mcp_compiler.cli import entry; entry()\n"
            "print('never reached')")
    r = subprocess.run([sys.executable, "-c", code, "passes", "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True and "never reached" not in r.stdout
    assert r.stderr.strip() == "handler ran"
    r = subprocess.run([sys.executable, "-c", code, "inspect", str(tmp_path / "nothing.onnx")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.rstrip().endswith("handler ran")


def test_deterministic_output(tmp_path):
    for name in ("a", "b"):
        assert runner.invoke(app, ["convert", "-i", str(MLP), "-o", str(tmp_path / f"{name}.mcpir")]).exit_code == 0
    assert (tmp_path / "a.mcpir").read_bytes() == (tmp_path / "b.mcpir").read_bytes()
    assert onnx.load(MLP)  # the input is untouched and still loads


def test_passes_report_and_listing(tmp_path):
    r = runner.invoke(app, ["passes"])
    assert r.exit_code == 0 and "constant-to-initializer:" in r.output
    src = GOLDEN / "convnet" / "model.onnx"
    rep = tmp_path / "report.json"
    r = runner.invoke(app, ["convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                            "--report", str(rep), "-v", "--verify-each", "--disable-pass", "deduplicate-weights"])
    assert r.exit_code == 0, r.output
    data = json.loads(rep.read_text())
    names = [p["name"] for p in data["passes"]]
    assert "deduplicate-weights" not in names and names[0] == "constant-to-initializer"
    assert all({"seconds", "nodes_before", "nodes_after", "modified", "stats"} <= set(p) for p in data["passes"])
    assert "identity-elimination (round 0)" in r.output
    r = runner.invoke(app, ["convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r2"),
                            "--passes", "dead-code-elimination,frobnicate"])
    assert r.exit_code == 2 and "unknown pass 'frobnicate'" in r.output


def test_start_up_imports_nothing_heavy():
    # `mcp-cli --version` / `--help` must not pay for onnx, onnxruntime or numpy (0.5 s -> 0.13 s here)
    import subprocess
    import sys

    code = ("import sys, mcp_compiler.cli; "
            "print(sorted(m for m in ('onnx', 'onnxruntime', 'numpy', 'flatbuffers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["targets", "--json"], ["passes", "--json"], ["convert", "--help"]])
def test_light_commands_import_nothing_heavy(argv):
    """issue 21: --version, --help, targets and passes import neither onnx, onnxruntime, numpy nor
    the FlatBuffers schema."""
    import subprocess
    import sys

    code = (f"import sys; from mcp_compiler.cli import main; sys.argv = ['mcp-cli', *{argv!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('onnx', 'onnxruntime', 'numpy', 'flatbuffers') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-500:]


def test_piped_output_is_written_without_rich(tmp_path):
    """On a pipe the reporter writes plain lines itself (rich, 17 ms of every command, is not
    imported), dropping the control characters rich drops; where the environment asks for a
    terminal (FORCE_COLOR) rich renders, as before."""
    import os

    code = ("import sys; from mcp_compiler.report import Reporter; r = Reporter()\n"
            "r.out.print('a\\rb\\x07 [bold]c[/bold] :smile:', markup=False); r.warning('w')\n"
            "print('rich' in sys.modules, file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout == "ab [bold]c[/bold] :smile:\n", r.stdout
    assert r.stderr == "warning: w\nFalse\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**env, "FORCE_COLOR": "1"})
    assert r.returncode == 0 and "ab [bold]c[/bold] :smile:" in r.stdout and r.stderr.endswith("True\n")


def test_a_named_command_is_built_alone_and_reads_the_same(tmp_path):
    """main() builds only the command the first argument names: its help, usage errors and the
    group's own help and suggestions are what they were."""
    exe = [sys.executable, "-m", "mcp_compiler.cli"]
    r = subprocess.run([*exe, "inspect", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "Usage:" in r.stdout and "inspect" in r.stdout
    r = subprocess.run([*exe, "convert", "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "No such option: --bogus" in r.stderr
    r = subprocess.run([*exe, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and all(c in r.stdout for c in ("convert", "inspect", "serve", "deploy", "tune"))
    r = subprocess.run([*exe, "conver"], capture_output=True, text=True)
    assert r.returncode == 2 and "Did you mean 'convert'" in r.stderr
    code = ("import sys; from mcp_compiler.cli import application as a; sys.argv = ['mcp-cli', 'passes', '--json']\n"
            "try:\n    a.main()\nexcept SystemExit:\n    pass\n"
            "print([c.callback.__name__ for c in a.app.registered_commands], file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stderr.strip().splitlines()[-1] == "['list_passes']", r.stderr


@pytest.mark.parametrize("argv, loaded", [(["convert", "--help"], False), (["passes", "--json"], False),
                                          (["serve", "--help"], True), (["--help"], True)])
def test_target_commands_are_loaded_only_when_a_command_may_be_one(argv, loaded):
    """A compiler command (convert, inspect, ...) run by main() does not load the targets' own
    commands; a target command, the group's help (and its suggestions) do."""
    code = (f"import sys; from mcp_compiler.cli import main; sys.argv = ['mcp-cli', *{argv!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('mcp_compiler.targets.triton.commands' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stderr.strip().splitlines()[-1] == str(loaded), r.stderr
    assert "Usage:" in r.stdout or argv[-1] == "--json"


def test_plain_lines_are_flushed_as_they_are_written(monkeypatch):
    """A piped `mcp-cli serve | tee log` shows each line when it is printed (rich flushed after
    every print; the plain path does too)."""
    import io

    from mcp_compiler.report import Reporter

    class Pipe(io.StringIO):
        flushes = 0

        def isatty(self) -> bool:
            return False

        def flush(self) -> None:
            self.flushes += 1

    pipe = Pipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    Reporter().out.print("Triton is serving repo", markup=False)
    assert pipe.getvalue() == "Triton is serving repo\n" and pipe.flushes == 1
