"""Every command's --json: one object, {"ok": true, ...} or {"ok": false, "error": {type,
message, exit_code}}, also for usage errors (what CI parses)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _helpers import GOLDEN, closed_port
from typer.testing import CliRunner

from mcp_compiler.cli import app

MLP = GOLDEN / "mlp" / "model.onnx"
runner = CliRunner()



def _envelope(args: list[str]) -> tuple[int, dict]:
    r = runner.invoke(app, [*args, "--json"])
    out = json.loads(r.stdout)   # exactly one JSON document on stdout
    assert isinstance(out["ok"], bool)
    if not out["ok"]:
        err = out["error"]
        assert set(err) == {"type", "message", "exit_code"} and err["exit_code"] == r.exit_code != 0
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1   # and one line on stderr
    else:
        assert r.exit_code == 0
    return r.exit_code, out


@pytest.fixture(scope="module")
def entry(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    r = runner.invoke(app, ["convert", str(MLP), "-t", "triton-v1.12", "-o", str(repo), "--name", "mlp"])
    assert r.exit_code == 0, r.output
    return repo / "mlp"


def test_success_envelopes(tmp_path, entry):
    code, out = _envelope(["convert", str(MLP), "-o", str(tmp_path / "m.mcpir")])
    assert out["ok"] and out["nodes"] > 0 and out["files"] == ["m.mcpir"]
    assert _envelope(["inspect", str(MLP)])[1]["inputs"][0]["name"] == "x"
    assert "fold-constants" in [p["name"] for p in _envelope(["passes"])[1]["passes"]]
    assert _envelope(["targets"])[1]["targets"][0]["name"] == "triton-v1.12"
    v = _envelope(["verify", str(MLP), str(entry)])[1]
    assert v["ok"] and v["outputs"][0]["ok"]
    d = _envelope(["deploy", str(entry), "--url", f"127.0.0.1:{closed_port()}", "--dry-run"])[1]
    assert d["ok"] and d["dry_run"] and d["name"] == "mlp"


def test_zoo_json_and_report_are_one_schema(tmp_path):
    shutil.copy(MLP, tmp_path / "mlp.onnx")
    (tmp_path / "zoo.yaml").write_text("models:\n  - name: mlp\n    source: {path: mlp.onnx}\n")
    code, out = _envelope(["zoo", str(tmp_path / "zoo.yaml"), "-o", str(tmp_path / "repo"), "-j", "1",
                           "--cache", str(tmp_path / "cache"), "--report", str(tmp_path / "r.json")])
    assert out["ok"] and out["counts"]["converted"] == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert set(report) == set(out) and report["models"] == out["models"]


@pytest.mark.parametrize("args, kind", [
    (["convert", "missing.onnx", "-o", "x.mcpir"], "InvalidModelError"),
    (["convert", "--no-such-flag"], "UsageError"),                          # typer's own parsing
    (["convert", str(MLP), "--layout", "nchwc", "-o", "x.mcpir"], "UsageError"),
    (["inspect", "missing.onnx"], "InvalidModelError"),
    (["passes", "--bogus"], "UsageError"),
    (["targets", "--bogus"], "UsageError"),
    (["zoo", "missing.yaml"], "UsageError"),
    (["serve", "no/such/repository"], "UsageError"),
    (["verify", str(MLP), "no/such/entry"], "UsageError"),
    (["deploy", "no/such/entry", "--url", "127.0.0.1:1"], "UsageError"),
    (["status", "--url", "127.0.0.1:{port}", "--timeout", "2"], "ServerUnreachableError"),
    (["undeploy", "m", "--url", "127.0.0.1:{port}", "--timeout", "2"], "ServerUnreachableError"),
    (["deploy", "x", "--url", "http://h:1"], "UsageError"),
    (["bench", "no/such/entry"], "UsageError"),
    (["bench", "m", "--url", "127.0.0.1:{port}", "--timeout", "2"], "ServerUnreachableError"),
    (["bench", "m", "--concurrency", "4,x"], "UsageError"),
    (["tune", "no/such/entry", "--slo-p99-ms", "5"], "UsageError"),
    (["tune", "no/such/entry", "--slo-p99-ms", "5", "--concurrency", "2", "--rate", "9"], "UsageError"),
    (["generate", "no/such/entry", "hello"], "UsageError"),
    (["generate", "m", "hello", "--url", "127.0.0.1:{port}", "--timeout", "2"], "ServerUnreachableError"),
])
def test_error_envelopes(args, kind, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    port = closed_port()
    code, out = _envelope([a.format(port=port) for a in args])
    assert not out["ok"] and out["error"]["type"] == kind, out


def test_every_command_is_covered():
    """A new command gets a --json envelope case here."""
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert names == {"convert", "inspect", "passes", "targets", "zoo", "serve", "verify", "deploy",
                     "status", "undeploy", "bench", "tune", "generate"}
