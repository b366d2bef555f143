"""The serving loop as one workflow, against the real local tritonserver: `serve` loads the
repository AND accepts deploys; `--url` takes what `serve` prints; a model that cannot load stops
`serve` naming it; redeploys of changed files really reload; undeploy waits and removes what deploy
kept; the exit codes are docs/errors.md's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from _helpers import GOLDEN, Serve, negated_mlp, ort_run, raising_copy

from mcp_compiler import CompileOptions, compile_model

pytestmark = pytest.mark.slow  # a real Triton

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver to serve with")

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
MLP, CONVNET = GOLDEN / "mlp" / "model.onnx", GOLDEN / "convnet" / "model.onnx"


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    d = tmp_path_factory.mktemp("loop")
    compile_model(MLP, d / "repo", CompileOptions.for_target("triton-v1.12", "mlp"))
    compile_model(CONVNET, d / "repo2", CompileOptions.for_target("triton-v1.12", "convnet"))
    # other weights under the same name and version: a changed deploy
    compile_model(negated_mlp(d / "mlp_neg.onnx"), d / "repo_neg", CompileOptions.for_target("triton-v1.12", "mlp"))
    raising_copy(d / "repo" / "mlp", d / "broken" / "mlp", "initialize", "no weights here")
    return d


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ, MCP_STATE_DIR=str(tmp_path / "state"), PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    e.pop("MCP_API_KEY", None)
    return e


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=300)


def _infer(url: str, name: str, feeds: dict, output: str) -> np.ndarray:
    import tritonclient.grpc as tg

    c = tg.InferenceServerClient(url.removeprefix("grpc://"))
    inputs = []
    for k, v in feeds.items():
        i = tg.InferInput(k, list(v.shape), "FP32")
        i.set_data_from_numpy(v)
        inputs.append(i)
    y = c.infer(name, inputs).as_numpy(output)
    c.close()
    return y


def test_serve_deploy_status_undeploy_one_loop(repos, env, tmp_path):
    """The issue's loop: serve repo &, deploy repo2/OTHER --url grpc://, status --url http://, query
    both, undeploy OTHER, Ctrl-C: every step exits 0, says what happened, leaves nothing."""
    s = Serve([str(repos / "repo")], env)
    try:
        assert s.grpc and s.http, s.out
        grpc, http = s.grpc.group(1), s.http.group(1)
        assert "model mlp v1: READY" in s.out and f"mcp-cli deploy DIR/NAME --url {grpc}" in s.out
        r = _cli("deploy", str(repos / "repo2" / "convnet"), "--url", grpc, env=env)
        assert r.returncode == 0, r.stderr
        assert "deployed convnet v1" in r.stdout and "kept for --rollback-on-failure" in r.stdout
        r = _cli("status", "--url", http, env=env)
        assert r.returncode == 0, r.stderr
        assert "convnet v1: READY" in r.stdout and "mlp v1: READY" in r.stdout, r.stdout
        x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
        np.testing.assert_allclose(_infer(grpc, "mlp", {"x": x}, "y"), ort_run(MLP, {"x": x})[0], rtol=1e-6)
        m = onnx.load(CONVNET)
        name = m.graph.input[0].name
        img = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
        got = _infer(grpc, "convnet", {name: img}, m.graph.output[0].name)
        np.testing.assert_allclose(got, ort_run(CONVNET, {name: img})[0], rtol=1e-5, atol=1e-6)
        r = _cli("undeploy", "convnet", "--url", grpc, env=env)
        assert r.returncode == 0, r.stderr
        assert "unloaded convnet" in r.stdout and "removed its rollback copy" in r.stdout
        # a model of the repository unloads through UNLOADING: undeploy waits until it is over
        r = _cli("undeploy", "mlp", "--url", http, "--json", env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["state"] == "UNAVAILABLE", r.stdout + r.stderr
        r = _cli("status", "--url", grpc, env=env)
        assert "mlp v1: UNAVAILABLE (unloaded)" in r.stdout and "convnet" not in r.stdout, r.stdout
    finally:
        rc, out, err = s.stop()
    assert rc == 0 and "stopping tritonserver" in err, err
    state = tmp_path / "state" / "deployments"
    assert not state.exists() or not any(state.iterdir()), list(state.rglob("*"))
    assert not list(tmp_path.glob("mcp-triton-*")), "the server's temporary folder is left"


def test_url_forms_and_wrong_protocol_hints(repos, env):
    s = Serve([str(repos / "repo")], env)
    try:
        grpc, http = s.grpc.group(1), s.http.group(1)
        hp_grpc, hp_http = grpc.removeprefix("grpc://"), http.removeprefix("http://")
        for url, extra in ((grpc, []), (http, []), (hp_grpc, []), (hp_http, ["--protocol", "http"]),
                           (grpc + "/", []), (hp_http, ["--protocol", "HTTP"])):
            r = _cli("status", "--url", url, *extra, env=env)
            assert r.returncode == 0 and "mlp v1: READY" in r.stdout, (url, r.stderr)
        # the HTTP port given to gRPC, and the reverse: one line naming the other protocol
        r = _cli("status", "--url", hp_http, env=env)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"use --url http://{hp_http}" in r.stderr, r.stderr
        r = _cli("status", "--url", f"http://{hp_grpc}", env=env)
        assert r.returncode == 1 and f"use --url grpc://{hp_grpc}" in r.stderr, r.stderr
        # a scheme and a --protocol that disagree, an unknown scheme, no port: usage errors
        for args in (["--url", grpc, "--protocol", "http"], ["--url", "ftp://127.0.0.1:1"],
                     ["--url", "127.0.0.1"], ["--url", "http://127.0.0.1:1/v2/models"]):
            r = _cli("status", *args, env=env)
            assert r.returncode == 2 and r.stderr.startswith("error: --url"), (args, r.stderr)
        # bench measures over gRPC: an http:// address is named as the problem
        r = _cli("bench", "mlp", "--url", http, "--seconds", "0.2", "-c", "1", env=env)
        assert r.returncode == 2 and "gRPC" in r.stderr, r.stderr
    finally:
        assert s.stop()[0] == 0


def test_serve_stops_on_a_model_that_cannot_load(repos, env, tmp_path):
    repo = tmp_path / "mixed"
    shutil.copytree(repos / "repo", repo)
    r = _cli("convert", str(MLP), "-t", "triton-v1.12", "-o", str(repo), "--name", "ortmlp",
             "--backend", "onnxruntime", env=env)
    assert r.returncode == 0 and "cannot load it" in r.stderr, r.stderr   # said at conversion time
    s = Serve([str(repo)], env)
    rc, out, err = s.stop()
    lines = err.strip().splitlines()
    assert rc == 1, err
    assert lines[0].startswith("model ortmlp v1: UNAVAILABLE: ") and "onnxruntime" in lines[0], err
    assert lines[-1] == "error: 1 of 2 models failed to load (listed above); --allow-unavailable serves the others"
    assert "Traceback" not in err
    s = Serve([str(repo), "--allow-unavailable"], env)
    try:
        assert "model mlp v1: READY" in s.out and "model ortmlp v1: UNAVAILABLE" in s.out, s.out
    finally:
        assert s.stop()[0] == 0


def test_redeploy_same_version_reloads_or_refuses(repos, env):
    """Issue 35's redeploy: changed files under the same name and version are never reported live
    while the old model serves."""
    s = Serve([str(repos / "repo")], env)
    try:
        grpc = s.grpc.group(1)
        x = np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32)
        # the model serve loaded from disk carries no content hash: replacing it takes --force
        r = _cli("deploy", str(repos / "repo" / "mlp"), "--url", grpc, env=env)
        assert r.returncode == 2 and "not deployed by mcp-cli" in r.stderr, r.stderr
        assert _cli("deploy", str(repos / "repo" / "mlp"), "--url", grpc, "--force", env=env).returncode == 0
        # the same files again: nothing to reload, said so
        r = _cli("deploy", str(repos / "repo" / "mlp"), "--url", grpc, env=env)
        assert r.returncode == 0 and "not reloaded" in r.stdout, r.stdout + r.stderr
        # other files as v1: refused without --force, nothing changed on the server
        r = _cli("deploy", str(repos / "repo_neg" / "mlp"), "--url", grpc, env=env)
        assert r.returncode == 2 and "--force replaces it" in r.stderr, r.stderr
        np.testing.assert_allclose(_infer(grpc, "mlp", {"x": x}, "y"), ort_run(MLP, {"x": x})[0], rtol=1e-6)
        # with --force: a real reload, and the server now serves the new weights
        r = _cli("deploy", str(repos / "repo_neg" / "mlp"), "--url", grpc, "--force", "--json", env=env)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["unchanged"] is False and rep["load_seconds"] > 0.2, rep   # a stub really started
        np.testing.assert_allclose(_infer(grpc, "mlp", {"x": x}, "y"),
                                   ort_run(repos / "mlp_neg.onnx", {"x": x})[0], rtol=1e-6)
        # the same files under another config (a larger max_batch_size) are a change too
        cfg_only = repos.parent / f"{repos.name}_cfg" / "mlp"
        if not cfg_only.exists():
            shutil.copytree(repos / "repo_neg" / "mlp", cfg_only)
            text = (cfg_only / "config.pbtxt").read_text()
            (cfg_only / "config.pbtxt").write_text(re.sub(r"max_batch_size: \d+", "max_batch_size: 3", text))
        r = _cli("deploy", str(cfg_only), "--url", grpc, env=env)
        assert r.returncode == 2 and "other files or config" in r.stderr, r.stdout + r.stderr
        r = _cli("deploy", str(cfg_only), "--url", grpc, "--force", "--json", env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["unchanged"] is False, r.stdout + r.stderr
        # a model.py that raises at load, forced over it: the load failure, the old one still serving
        r = _cli("deploy", str(repos / "broken" / "mlp"), "--url", grpc, "--force", env=env)
        assert r.returncode == 1 and "no weights here" in r.stderr and "still serving" in r.stderr, r.stderr
        np.testing.assert_allclose(_infer(grpc, "mlp", {"x": x}, "y"),
                                   ort_run(repos / "mlp_neg.onnx", {"x": x})[0], rtol=1e-6)
    finally:
        assert s.stop()[0] == 0


def test_deploy_state_is_bounded_and_a_polling_server_is_explained(repos, env, tmp_path):
    s = Serve([str(repos / "repo"), "--no-load"], env)
    try:
        grpc = s.grpc.group(1)
        keep1 = dict(env, MCP_STATE_KEEP="1")
        for entry in (repos / "repo" / "mlp", repos / "repo2" / "convnet"):
            assert _cli("deploy", str(entry), "--url", grpc, env=keep1).returncode == 0
        kept = [p.name for p in (tmp_path / "state" / "deployments").glob("*/*")]
        assert kept == ["convnet"], kept   # the older record went
        r = _cli("deploy", str(repos / "repo" / "mlp"), "--url", grpc, "--model-version", "2",
                 env=dict(env, MCP_STATE_KEEP="0"))
        assert r.returncode == 0 and "kept for" not in r.stdout, r.stdout
    finally:
        assert s.stop()[0] == 0
    s = Serve([str(repos / "repo"), "--poll"], env)
    try:
        r = _cli("deploy", str(repos / "repo2" / "convnet"), "--url", s.grpc.group(1), env=env)
        assert r.returncode == 1 and "polls its repository" in r.stderr and "mcp-cli serve DIR" in r.stderr, r.stderr
    finally:
        assert s.stop()[0] == 0
