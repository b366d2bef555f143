"""Hardening, round 3 (issue 35): each finding of the campaign, rebuilt here, ends in one clean
`error:` line with the documented exit code, within seconds, with nothing written outside the
places named and nothing half-written left behind. (The redeploy finding is in
tests/e2e/test_serving_loop.py: it needs a real Triton.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from _helpers import GOLDEN, one_error
from onnx import TensorProto, helper

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
T = "triton-v1.12"
MLP = GOLDEN / "mlp" / "model.onnx"
F = TensorProto.FLOAT


def _cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 120):
    t0 = time.monotonic()
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    r.seconds = time.monotonic() - t0
    return r


_one_error = one_error


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# -- 1: a zoo name never writes outside --output, for any target --------------------------------------

@pytest.mark.parametrize("name, where", [("../../../escaped", "model"), ("/tmp/abs_escaped", "model"),
                                         ("../escaped", "defaults")])
def test_zoo_names_are_confined_for_every_target(tmp_path, name, where):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    (work / "model.onnx").write_bytes(MLP.read_bytes())
    target = "    target: onnx\n" if where == "model" else ""
    defaults = "defaults: {target: onnx}\n" if where == "defaults" else ""
    (work / "zoo.yaml").write_text(f"{defaults}models:\n  - name: {name}\n{target}    source: {{path: model.onnx}}\n")
    before = _tree(tmp_path)
    r = _cli("zoo", "zoo.yaml", "-o", "out", "--cache", "cache", cwd=work)
    _one_error(r, 2, "model name", "not accepted")
    assert _tree(tmp_path) - before <= {"a/b/cache", "a/b/cache/entries"}, _tree(tmp_path) - before
    assert not Path("/tmp/abs_escaped.onnx").exists()


# -- 3: --report (and every file output) needs --force, and is never the input -----------------------

def test_report_never_overwrites_the_input_and_needs_force(tmp_path):
    keep = tmp_path / "keep.onnx"
    keep.write_bytes(MLP.read_bytes())
    r = _cli("convert", str(keep), "-t", T, "-o", str(tmp_path / "r1"), "--report", str(keep))
    _one_error(r, 2, "--report", "is the input")
    r = _cli("convert", str(keep), "-t", T, "-o", str(tmp_path / "r1"), "--report", str(keep), "--force")
    _one_error(r, 2, "is the input")
    assert keep.read_bytes() == MLP.read_bytes() and not (tmp_path / "r1").exists()
    old = tmp_path / "old.json"
    old.write_text("{}")
    r = _cli("convert", str(keep), "-t", T, "-o", str(tmp_path / "r2"), "--report", str(old))
    _one_error(r, 2, "exists", "--force")
    assert old.read_text() == "{}"
    r = _cli("convert", str(keep), "-t", T, "-o", str(tmp_path / "r2"), "--report", str(old), "--force")
    assert r.returncode == 0 and json.loads(old.read_text())["passes"]   # the report replaced it
    # -o out.onnx over its own input, even with --force
    r = _cli("convert", str(keep), "-o", str(keep), "--force")
    _one_error(r, 2, "is the input")
    assert keep.read_bytes() == MLP.read_bytes()
    # zoo's report and junit likewise
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "mlp.onnx").write_bytes(MLP.read_bytes())
    man = tmp_path / "m" / "zoo.yaml"
    man.write_text("models:\n  - name: mlp\n    source: {path: mlp.onnx}\n")
    r = _cli("zoo", str(man), "-o", str(tmp_path / "z"), "--cache", str(tmp_path / "c"), "--junit", str(old))
    _one_error(r, 2, "--junit", "--force")
    r = _cli("zoo", str(man), "-o", str(tmp_path / "z"), "--cache", str(tmp_path / "c"), "--report", str(man), "--force")
    _one_error(r, 2, "is the input")


# -- 4: names that are not UTF-8 ---------------------------------------------------------------------

def _non_utf8(tmp_path: Path) -> tuple[Path, Path]:
    m = onnx.load(MLP)
    data = m.SerializeToString()
    op = m.graph.node[0].op_type.encode()
    bad_op = tmp_path / "badop.onnx"
    bad_op.write_bytes(data.replace(op, op[:-1] + b"\xff", 1))
    m.opset_import.add(domain="zzz", version=1)
    bad_domain = tmp_path / "baddomain.onnx"
    bad_domain.write_bytes(m.SerializeToString().replace(b"zzz", b"zz\xff"))
    return bad_op, bad_domain


def test_non_utf8_op_type_and_domain(tmp_path):
    bad_op, bad_domain = _non_utf8(tmp_path)
    for model, what in ((bad_op, "op_type"), (bad_domain, "opset_import domain")):
        r = _cli("inspect", str(model), "--json")
        _one_error(r, 2, what, "not valid UTF-8")
        assert json.loads(r.stdout)["error"]["type"] == "InvalidModelError"
        _one_error(_cli("inspect", str(model)), 2, "not valid UTF-8")
        for out in ("x.mcpir", "x.onnx"):
            r = _cli("convert", str(model), "-o", str(tmp_path / out), "--no-check")
            _one_error(r, 2, "not valid UTF-8")
            assert not (tmp_path / out).exists()


# -- 5, 6, 10, 17: verify's sizes, samples, tolerances and time --------------------------------------

def test_size_search_never_draws_huge_samples(tmp_path):
    """A model that fails at every size: the search stops below the probe limit (was: 8192 x 8192
    drawn as float64, 24 GB of RSS)."""
    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.inputs import PROBE_LIMIT, plan, probe

    x = helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", F, ["N", 3, "H", "W"])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = load_onnx(path).model
    seen = []

    def fails(feeds):
        seen.append(sum(a.nbytes for a in feeds.values()))
        raise RuntimeError("never")

    from mcp_compiler.errors import UsageError

    with pytest.raises(UsageError, match="fails on every input size tried"):
        probe(model, plan(model), fails)
    assert seen and max(seen) <= PROBE_LIMIT, max(seen)


def test_verify_flag_bounds(tmp_path):
    repo = tmp_path / "repo"
    assert _cli("convert", str(MLP), "-t", T, "-o", str(repo), "--name", "mlp").returncode == 0
    r = _cli("verify", "--samples", "99999999999999999999", str(MLP), str(repo / "mlp"))
    assert r.returncode == 2 and "--samples" in r.stderr and r.seconds < 30, r.stderr
    _one_error(_cli("verify", str(MLP), str(repo / "mlp"), "--rtol", "-1"), 2, "--rtol", "finite number >= 0")
    for flag, value in (("--atol", "nan"), ("--atol", "inf")):   # refused where every float flag is (round 4)
        _one_error(_cli("verify", str(MLP), str(repo / "mlp"), flag, value), 2, flag, "not a finite number")


def test_verify_times_out_on_a_model_that_runs_for_ever(tmp_path):
    """A Loop of 2^62 trips over the input (nothing to fold at conversion): verify --timeout ends it."""
    x = helper.make_tensor_value_info("x", F, [4])
    y = helper.make_tensor_value_info("y", F, [4])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Neg", ["v_in"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", F, [4])])
    nodes = [helper.make_node("Constant", [], ["M"], value=helper.make_tensor("m", TensorProto.INT64, [], [2**62])),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True])),
             helper.make_node("Loop", ["M", "c", "x"], ["y"], body=body)]
    model = tmp_path / "forever.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]), model)
    assert _cli("convert", str(model), "-t", T, "-o", str(tmp_path / "repo"), "--name", "f").returncode == 0
    r = _cli("verify", str(model), str(tmp_path / "repo" / "f"), "--timeout", "3", "--json", timeout=60)
    _one_error(r, 1, "verify took longer than 3 s (--timeout)")
    assert json.loads(r.stdout)["error"]["type"] == "TimeoutExceededError" and r.seconds < 30
    # convert --verify too (round 4): one line, exit 1, and no entry left in the repository
    r = _cli("convert", str(model), "-t", T, "-o", str(tmp_path / "repo2"), "--name", "f", "--verify",
             "--timeout", "5", timeout=90)
    _one_error(r, 1, "convert took longer than 5 s (--timeout)")
    assert not (tmp_path / "repo2" / "f").exists()


# -- 7, 8: special files and values that were internal errors -----------------------------------------

def test_inspect_of_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "f.onnx"
    os.mkfifo(fifo)
    r = _cli("inspect", str(fifo), timeout=30)
    _one_error(r, 2, "not a regular file")


def test_values_that_were_internal_errors(tmp_path):
    _one_error(_cli("convert", str(MLP), "-t", T, "-o", str(tmp_path / "r"), "--fold-size-limit", "inf"),
               2, "--fold-size-limit")
    man = tmp_path / "zoo.yaml"
    man.write_text("models:\n  - name: mlp\n    source: {path: mlp.onnx}\n")
    (tmp_path / "mlp.onnx").write_bytes(MLP.read_bytes())
    _one_error(_cli("zoo", str(man), "-o", str(tmp_path / "z"), "--shard", "²/2"), 2, "--shard")
    big = tmp_path / "big.yaml"
    big.write_text(f"max_batch_size: {'9' * 5000}\n")
    _one_error(_cli("convert", str(MLP), "-t", T, "-o", str(tmp_path / "r"), "--config", str(big)), 2, str(big))
    _one_error(_cli("convert", str(MLP), "-o", str(tmp_path / ("a" * 300 + ".mcpir"))), 2, "over the system's 255")
    deep = tmp_path.joinpath(*["b" * 200] * 25) / "x.mcpir"
    _one_error(_cli("convert", str(MLP), "-o", str(deep)), 2, "over the system's 4095")
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_error(_cli("zoo", str(man), "-o", str(tmp_path / "z"), "--cache", str(afile / "cache")), 2, "--cache")
    # an UNDEFINED input: inspect names it, for the .onnx and the .mcpir convert writes of it
    m = onnx.load(MLP)
    m.graph.input[0].type.tensor_type.elem_type = 0
    undef = tmp_path / "undef.onnx"
    onnx.save(m, undef)
    for path in (undef, tmp_path / "undef.mcpir"):
        if path.suffix == ".mcpir":
            assert _cli("convert", str(undef), "-o", str(path), "--no-check").returncode == 0
        r = _cli("inspect", str(path), "--json")
        assert r.returncode == 0, r.stderr
        assert "UNDEFINED" in json.loads(r.stdout)["input_sizes"]["error"]


# -- 9: a regular file where the entry was ------------------------------------------------------------

def test_replacing_a_regular_file_entry_leaves_no_staging(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mlp").write_text("not an entry")
    assert _cli("convert", str(MLP), "-t", T, "-o", str(repo), "--name", "mlp", "--force").returncode == 0
    assert (repo / "mlp" / "config.pbtxt").is_file()
    assert not [p for p in tmp_path.rglob("*") if "mcp-staging" in p.name], list(tmp_path.rglob("*"))


# -- 11, 13: deploy checks the entry and the certificates before any connection -----------------------

def test_deploy_dry_run_checks_the_entry_and_certificates(tmp_path):
    repo = tmp_path / "repo"
    assert _cli("convert", str(MLP), "-t", T, "-o", str(repo), "--name", "mlp").returncode == 0
    (repo / "mlp" / "1" / "model.mcpir").unlink()
    _one_error(_cli("deploy", str(repo / "mlp"), "--url", "127.0.0.1:1", "--dry-run"), 2, "no model.mcpir")
    assert _cli("convert", str(MLP), "-t", T, "-o", str(repo), "--name", "mlp", "--force").returncode == 0
    empty, garbage, folder, fifo = tmp_path / "empty.pem", tmp_path / "garbage.pem", tmp_path / "dir", tmp_path / "fifo"
    empty.write_bytes(b"")
    garbage.write_bytes(os.urandom(512))
    folder.mkdir()
    os.mkfifo(fifo)
    for cert, says in ((empty, "empty"), (garbage, "not PEM"), (folder, "not a regular file"),
                       (fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file"),
                       (tmp_path / "nope.pem", "does not exist")):
        r = _cli("deploy", str(repo / "mlp"), "--url", "127.0.0.1:1", "--ssl", "--root-cert", str(cert), "--no-smoke",
                 timeout=30)
        _one_error(r, 2, says)


# -- 12: accuracy budgets and zoo's JSON error -------------------------------------------------------

@pytest.mark.parametrize("budget", ["cos=nan", "cos=2", "cos=-1", "max-abs=-0.5", "top1=1e400", "cos=٠.9"])
def test_accuracy_budget_values_are_checked_before_any_work(tmp_path, budget):
    r = _cli("convert", str(MLP), "-t", T, "-o", str(tmp_path / "r"), "--quantize", "fp16", "--accuracy-budget", budget)
    _one_error(r, 2, "--accuracy-budget")
    assert r.seconds < 30 and not (tmp_path / "r").exists()


def test_zoo_json_failure_has_an_error_object(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07 not a model")
    man = tmp_path / "zoo.yaml"
    man.write_text("models:\n  - name: broken\n    source: {path: bad.onnx}\n")
    r = _cli("zoo", str(man), "-o", str(tmp_path / "z"), "--cache", str(tmp_path / "c"), "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["ok"] is False and out["error"]["type"] == "ZooFailedError", r.stdout
    assert "broken" in out["error"]["message"] and r.stderr.startswith("error: 1 of 1 models failed (broken)")


# -- 14, 15: models onnxruntime refuses ----------------------------------------------------------------

def _add_float_int(path: Path) -> Path:
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "g",
                          [helper.make_tensor_value_info("a", F, [2]), helper.make_tensor_value_info("b", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("c", F, [2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_onnx_output_is_load_checked_and_the_runtime_names_a_bad_mcpir(tmp_path):
    model = _add_float_int(tmp_path / "addmix.onnx")
    r = _cli("convert", str(model), "-o", str(tmp_path / "out.onnx"), "--no-check")
    _one_error(r, 1, "does not load in onnxruntime")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["addmix.onnx"]   # nothing half-written
    # the .mcpir of it: the serving runtime says which file and why, as its own error
    assert _cli("convert", str(model), "-o", str(tmp_path / "m.mcpir"), "--no-check").returncode == 0
    from mcp_compiler.targets.triton.emit import write_runtime
    from mcp_compiler.targets.triton.verify import load_runtime

    write_runtime(tmp_path / "rt")   # the runtime as a repository carries it
    runtime = load_runtime(tmp_path / "rt")
    with pytest.raises(runtime.MCPIRError, match="m.mcpir: the model in this MCP-IR file does not load in onnxruntime"):
        runtime.MCPIRModel(tmp_path / "m.mcpir")


def test_a_repository_entry_is_load_checked(tmp_path):
    """The triton target's load check (a session from the IR it just wrote, and the file's header):
    an entry onnxruntime refuses is never written."""
    model = _add_float_int(tmp_path / "addmix.onnx")
    r = _cli("convert", str(model), "-t", T, "-o", str(tmp_path / "repo"), "--no-check")
    _one_error(r, 1, "does not load in the serving runtime")
    assert not (tmp_path / "repo").exists()


def test_the_load_check_refuses_what_the_runtimes_reader_would(tmp_path):
    """onnxruntime sorts a node list itself; the serving runtime's reader does not: a graph out of
    topological order (a pass bug) is stopped by the load check, not found at serve time."""
    from mcp_compiler.errors import LoadCheckError
    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.targets.triton.emit import _check_ir

    model = load_onnx(MLP).model
    _check_ir(model)
    model.graph.nodes.reverse()
    with pytest.raises(LoadCheckError, match="does not load in the serving runtime: .*not defined before"):
        _check_ir(model)


# -- fuzz: mutated golden models through inspect and convert ------------------------------------------

GOLDEN_MODELS = sorted(p for p in GOLDEN.glob("*/model.onnx"))


@pytest.mark.slow
def test_fuzz_mutated_golden_models(tmp_path):
    """A bounded, seeded run: 60 mutants of the golden models (bytes flipped, truncated, spliced,
    strings made non-UTF-8) through inspect, convert -o .mcpir / .onnx / --target. Every run ends in
    exit 0, 1 or 2 with no internal error and no traceback, within 60 s, and a failed run writes nothing."""
    rng = np.random.default_rng(35)
    cases = []
    for k in range(60):
        src = GOLDEN_MODELS[k % len(GOLDEN_MODELS)].read_bytes()
        b = bytearray(src)
        how = ["flip", "truncate", "splice", "utf8"][k % 4]
        if how == "flip":
            for i in rng.integers(0, len(b), 1 + k % 8):
                b[i] ^= 1 << int(rng.integers(0, 8))
        elif how == "truncate":
            b = b[:int(rng.integers(1, len(b)))]
        elif how == "splice":
            i, j = sorted(rng.integers(0, len(b), 2))
            b = b[:i] + b[j:] + b[i:j]
        else:
            i = int(rng.integers(0, len(b)))
            b[i:i + 1] = b"\xff" if 32 <= b[i] < 127 else bytes([b[i]])
        p = tmp_path / f"m{k}_{how}.onnx"
        p.write_bytes(bytes(b))
        cases.append(p)
    outcomes: dict[int, int] = {}
    for k, p in enumerate(cases):
        out = tmp_path / f"out{k}"
        out.mkdir()
        cmd = [["inspect", str(p)], ["convert", str(p), "-o", str(out / "m.mcpir")],
               ["convert", str(p), "-o", str(out / "m.onnx")], ["convert", str(p), "-t", T, "-o", str(out / "repo")]][k % 4]
        r = _cli(*cmd, timeout=60)
        outcomes[r.returncode] = outcomes.get(r.returncode, 0) + 1
        assert r.returncode in (0, 1, 2), (p.name, r.returncode, r.stderr[-500:])
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr, (p.name, r.stderr[-800:])
        if r.returncode != 0:
            assert not any(x.is_file() for x in out.rglob("*")), (p.name, list(out.rglob("*")))
    assert outcomes.get(2, 0) > 10, outcomes   # the mutants are mostly refused as invalid
