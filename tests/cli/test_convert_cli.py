"""convert's CLI shape: the model as an argument, grouped help with examples, values of a fixed
set in any case, flags named in errors."""

from __future__ import annotations

from _helpers import GOLDEN
from typer.testing import CliRunner

from mcp_compiler.cli import app

MLP = GOLDEN / "mlp" / "model.onnx"
runner = CliRunner()


def test_model_is_an_argument_and_input_still_works(tmp_path):
    r = runner.invoke(app, ["convert", str(MLP), "-o", str(tmp_path / "a.mcpir")])
    assert r.exit_code == 0 and (tmp_path / "a.mcpir").is_file(), r.output
    r = runner.invoke(app, ["convert", "--input", str(MLP), "-o", str(tmp_path / "b.mcpir")])
    assert r.exit_code == 0 and (tmp_path / "b.mcpir").is_file(), r.output
    r = runner.invoke(app, ["convert", "-o", str(tmp_path / "c.mcpir")])
    assert r.exit_code == 2 and "missing MODEL" in r.stderr


def test_verify_given_the_entry_alone_says_the_original_comes_first(tmp_path):
    entry = tmp_path / "repo" / "m"
    entry.mkdir(parents=True)
    r = runner.invoke(app, ["verify", str(entry)])
    assert r.exit_code == 2 and f"`mcp-cli verify MODEL.onnx {entry}`" in r.stderr, r.output
    r = runner.invoke(app, ["verify"])
    assert r.exit_code == 2 and "missing MODEL: the original .onnx model, then the entry" in r.stderr, r.output


def test_help_has_panels_examples_and_no_bool_metavar():
    r = runner.invoke(app, ["convert", "--help"], terminal_width=200)
    assert r.exit_code == 0
    for panel in ("Input and output", "Pipeline", "Quantization", "Target: serving", "Checks", "Reporting"):
        assert panel in r.stdout
    assert "Examples" in r.stdout and "mcp-cli convert model.onnx -o model.mcpir" in r.stdout
    assert "<bool>" not in r.stdout
    import typer.main

    for name, cmd in typer.main.get_command(app).commands.items():   # every option has a help text
        for p in cmd.params:
            assert getattr(p, "help", None) or p.param_type_name == "argument", f"{name} {p.opts} has no help"
    for cmd in ("inspect", "passes", "targets", "zoo", "serve", "verify", "deploy", "status", "undeploy"):
        assert "Examples" in runner.invoke(app, [cmd, "--help"], terminal_width=200).stdout, cmd


def test_fixed_values_any_case(tmp_path):
    r = runner.invoke(app, ["convert", str(MLP), "-t", "TRITON-v1.12", "-o", str(tmp_path / "repo"),
                            "--backend", "ONNXRuntime", "--kind", "CPU", "--layout", "NCHW"])
    assert r.exit_code == 0, r.output
    assert 'backend: "onnxruntime"' in (tmp_path / "repo" / "model" / "config.pbtxt").read_text()


def test_errors_name_the_flag(tmp_path):
    r = runner.invoke(app, ["convert", str(MLP), "-t", "triton-v1.12", "-o", str(tmp_path / "r"),
                            "--max-batch-size", "0"])
    assert r.exit_code == 2 and "--max-batch-size must be a positive integer" in r.stderr
    (tmp_path / "mcp.yaml").write_text("max_batch_size: 0\n")
    r = runner.invoke(app, ["convert", str(MLP), "-t", "triton-v1.12", "-o", str(tmp_path / "r"),
                            "--config", str(tmp_path / "mcp.yaml")])
    assert r.exit_code == 2 and "mcp.yaml: max_batch_size must be a positive integer" in r.stderr
    r = runner.invoke(app, ["convert", str(MLP), "-o", str(tmp_path / "x.mcpir"), "--max-batch-size", "4"])
    assert r.exit_code == 2 and "--max-batch-size needs --target" in r.stderr


def test_deploy_model_version_flag_and_program_version():
    r = runner.invoke(app, ["deploy", "--help"], terminal_width=200)
    assert "--model-version" in r.stdout
    assert runner.invoke(app, ["--version"]).stdout.startswith("mcp-cli ")


def test_explain_pass_is_for_rule_sets(tmp_path):
    r = runner.invoke(app, ["convert", str(GOLDEN / "mlp" / "model.onnx"), "-t", "triton-v1.12", "-o",
                            str(tmp_path / "repo"), "--explain-pass", "dead-code-elimination"])
    assert r.exit_code == 2 and "not a rule set" in r.stderr and "matmul-add-to-gemm" in r.stderr
    assert "identity-elimination" in r.stderr and "optimize-transposes" in r.stderr
    assert not (tmp_path / "repo").exists()


def _commands(group, path=()):
    import click

    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_help_never_cuts_a_flag_name_at_80_columns_and_up():
    import typer.main

    for path, cmd in _commands(typer.main.get_command(app)):
        if getattr(cmd, "hidden", False):
            continue
        for width in (80, 100, 120):
            r = runner.invoke(app, [*path, "--help"], terminal_width=width)
            assert r.exit_code == 0, (path, r.output)
            out = r.stdout
            assert "…" not in out, f"{' '.join(path)} --help at {width} columns cuts: " + \
                next(ln for ln in out.splitlines() if "…" in ln)
            assert max(len(ln) for ln in out.splitlines()) <= width, (path, width)
            flat = " ".join(out.split())
            for p in cmd.params:
                if getattr(p, "hidden", False) or p.param_type_name == "argument":
                    continue
                for flag in (*p.opts, *p.secondary_opts):
                    assert flag in flat, f"{' '.join(path)} --help at {width} columns lacks {flag}"
    r = runner.invoke(app, ["convert", "--help"], terminal_width=80)
    assert len(r.stdout.splitlines()) < 300    # 486 lines, 25 flags cut, with typer's six-column layout
