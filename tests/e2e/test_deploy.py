"""`mcp-cli deploy` against real tritonservers on 127.0.0.1: gRPC and HTTP, new versions,
a broken model beside a serving one, rollback, tokens on restricted endpoints, mutual TLS."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import GOLDEN, negated_mlp, ort_run, raising_copy

from mcp_compiler import CompileOptions, compile_model

pytestmark = pytest.mark.slow  # a real Triton

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver to deploy to")

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
MLP = GOLDEN / "mlp" / "model.onnx"


def _cli(*args: str, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    d = tmp_path_factory.mktemp("entries")
    compile_model(MLP, d / "repo", CompileOptions.for_target("triton-v1.12", "mlp"))
    # a second model with other weights: tells the versions apart
    compile_model(negated_mlp(d / "mlp2.onnx"), d / "repo2", CompileOptions.for_target("triton-v1.12", "mlp"))
    truncated = d / "truncated" / "mlp"
    shutil.copytree(d / "repo" / "mlp", truncated)
    data = (truncated / "1" / "model.mcpir").read_bytes()
    (truncated / "1" / "model.mcpir").write_bytes(data[:len(data) // 2])  # caught before uploading
    broken = raising_copy(d / "repo" / "mlp", d / "broken" / "mlp", "initialize", "no weights here")
    bad_smoke = raising_copy(d / "repo" / "mlp", d / "badsmoke" / "mlp", "execute", "boom")
    return {"v1": d / "repo" / "mlp", "v2": d / "repo2" / "mlp", "broken": broken, "bad_smoke": bad_smoke,
            "truncated": truncated,
            "mlp2": d / "mlp2.onnx"}


@pytest.fixture
def env(tmp_path, monkeypatch):
    import os

    e = dict(os.environ, MCP_STATE_DIR=str(tmp_path / "state"))
    e.pop("MCP_API_KEY", None)
    return e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from mcp_compiler.targets.triton.serve import TritonServer

    s = TritonServer(tmp_path_factory.mktemp("empty"), explicit=True)
    s.start()
    yield s
    s.close()


def _infer(url: str, protocol: str, x: np.ndarray) -> np.ndarray:
    mod = __import__(f"tritonclient.{protocol}", fromlist=["x"])
    c = mod.InferenceServerClient(url)
    i = mod.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    y = c.infer("mlp", [i]).as_numpy("y")
    c.close()
    return y


X = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_deploy_redeploy_broken_rollback(server, entries, env, protocol):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    base = ["--url", url, "--protocol", protocol]
    r = _cli("deploy", str(entries["v1"]), *base, env=env)
    assert r.returncode == 0, r.stderr
    assert "deployed mlp v1" in r.stdout and "READY in" in r.stdout and "smoke inference" in r.stdout
    np.testing.assert_allclose(_infer(url, protocol, X), ort_run(MLP, {"x": X})[0], rtol=1e-6)
    # a new version replaces it
    r = _cli("deploy", str(entries["v2"]), *base, "--version", "2", env=env)
    assert r.returncode == 0 and "(replacing v1)" in r.stdout, r.stderr
    np.testing.assert_allclose(_infer(url, protocol, X), ort_run(entries["mlp2"], {"x": X})[0], rtol=1e-6)
    # a truncated .mcpir: refused before anything is sent (exit 2), v2 keeps serving
    r = _cli("deploy", str(entries["truncated"]), *base, "--version", "3", env=env)
    assert r.returncode == 2 and "model.mcpir" in r.stderr and "truncated" in r.stderr, r.stderr
    # a model that fails to load on the server: a load failure (not "cannot reach"), the
    # server's reason, exit 1, and v2 keeps serving
    r = _cli("deploy", str(entries["broken"]), *base, "--version", "3", env=env)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert "failed to load mlp v3" in r.stderr and "cannot reach" not in r.stderr, r.stderr
    assert "still serving" in r.stderr and "no weights here" in r.stderr
    np.testing.assert_allclose(_infer(url, protocol, X), ort_run(entries["mlp2"], {"x": X})[0], rtol=1e-6)
    # loads, but the smoke inference fails: rolled back to the last good deploy on request
    r = _cli("deploy", str(entries["bad_smoke"]), *base, "--version", "4", "--rollback-on-failure", env=env)
    assert r.returncode == 1 and "rolled back: v2 is serving again" in r.stderr, r.stderr
    np.testing.assert_allclose(_infer(url, protocol, X), ort_run(entries["mlp2"], {"x": X})[0], rtol=1e-6)
    r = _cli("status", *base, "--json", env=env)
    assert r.returncode == 0 and any(m["name"] == "mlp" and m["state"] == "READY" for m in __import__("json").loads(r.stdout)["models"])
    r = _cli("undeploy", "mlp", *base, env=env)
    assert r.returncode == 0
    assert "no models" in _cli("status", *base, env=env).stdout
    # unloaded already, or never there: exit 1, said so
    for name in ("mlp", "nosuchmodel"):
        r = _cli("undeploy", name, *base, env=env)
        assert r.returncode == 1 and "not loaded on the server" in r.stderr, r.stderr


def test_smoke_request_from_user_inputs(server, entries, env, tmp_path):
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    np.savez(good, x=X)
    np.savez(bad, x=X.astype(np.float64))
    r = _cli("deploy", str(entries["v1"]), "--url", server.grpc_url, "--inputs", str(bad), env=env)
    assert r.returncode == 2 and "is float64" in r.stderr, r.stderr   # refused before anything is sent
    r = _cli("deploy", str(entries["v1"]), "--url", server.grpc_url, "--inputs", str(good), env=env)
    assert r.returncode == 0 and "smoke inference" in r.stdout, r.stderr
    assert _cli("undeploy", "mlp", "--url", server.grpc_url, env=env).returncode == 0


def test_dry_run_sends_nothing_and_hides_the_token(server, entries, env):
    r = _cli("deploy", str(entries["v1"]), "--url", server.grpc_url, "--dry-run", "--token", "s3cr3t", env=env)
    assert r.returncode == 0 and "1/model.mcpir" in r.stdout and "mcp-api-key: ***" in r.stdout
    assert "s3cr3t" not in r.stdout + r.stderr
    assert "no models" in _cli("status", "--url", server.grpc_url, env=env).stdout


def test_unknown_backend_is_refused_before_uploading(entries, env, tmp_path):
    odd = tmp_path / "odd" / "mlp"
    shutil.copytree(entries["v1"], odd)
    cfg = (odd / "config.pbtxt").read_text()
    (odd / "config.pbtxt").write_text(cfg.replace('backend: "python"', 'backend: "tensorrt_llm"'))
    r = _cli("deploy", str(odd), "--url", "127.0.0.1:1", env=env)  # no server needed: refused locally
    assert r.returncode == 2 and "backend 'tensorrt_llm'" in r.stderr, r.stderr


def test_unreachable_and_bad_flags(entries, env):
    r = _cli("deploy", str(entries["v1"]), "--url", "127.0.0.1:1", env=env)
    assert r.returncode == 1 and r.stderr.startswith("error: cannot reach Triton at grpc://127.0.0.1:1")
    r = _cli("deploy", str(entries["v1"]), "--url", "ftp://x:1", env=env)
    assert r.returncode == 2 and "unknown scheme" in r.stderr
    r = _cli("deploy", str(entries["v1"]), "--url", "127.0.0.1:1", "--client-cert", "a.pem", env=env)
    assert r.returncode == 2


def test_upload_limit_is_checked_before_sending(monkeypatch, entries):
    from mcp_compiler.errors import UsageError
    from mcp_compiler.targets.triton import deploy as d

    monkeypatch.setattr(d, "GRPC_UPLOAD_LIMIT", 1000)
    with pytest.raises(UsageError, match="one grpc load request carries at most"):
        d.deploy(entries["v1"], d.Connection("127.0.0.1:1"))


def test_token_on_restricted_endpoints(tmp_path, entries, env):
    from mcp_compiler.targets.triton.serve import TritonServer

    with TritonServer(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else None, explicit=True,
                      extra_args=["--grpc-restricted-protocol=model-repository:mcp-api-key=letmein",
                                  "--http-restricted-api=model-repository:mcp-api-key=letmein"]) as s:
        for protocol, url in (("grpc", s.grpc_url), ("http", s.http_url)):
            base = [str(entries["v1"]), "--url", url, "--protocol", protocol, "--no-smoke"]
            r = _cli("deploy", *base, "--token", "Zq9-not-it", env=env)
            assert r.returncode == 1 and r.stderr.startswith("error: ") and "Zq9-not-it" not in r.stderr and "refused" in r.stderr, r.stderr
            r = _cli("deploy", *base, env=dict(env, MCP_API_KEY="letmein"))
            assert r.returncode == 0, r.stderr
            assert "letmein" not in r.stdout + r.stderr


def _certs(d: Path) -> dict[str, Path]:
    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=mcp-test-ca",
        "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={'localhost' if who == 'server' else 'mcp-client'}",
            "-keyout", str(d / f"{who}.key"), "-out", str(d / f"{who}.csr"))
        run("x509", "-req", "-in", str(d / f"{who}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-days", "2", "-extfile", str(d / "san.cnf"), "-out", str(d / f"{who}.pem"))
    return {k: d / f"{k}" for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI needed to make test certificates")
def test_mutual_tls(tmp_path, entries, env):
    from mcp_compiler.targets.triton.serve import TritonServer

    c = _certs(tmp_path)
    (tmp_path / "empty").mkdir()
    args = ["--grpc-use-ssl=true", "--grpc-use-ssl-mutual=true", f"--grpc-server-cert={c['server.pem']}",
            f"--grpc-server-key={c['server.key']}", f"--grpc-root-cert={c['ca.pem']}"]
    with TritonServer(tmp_path / "empty", explicit=True, extra_args=args) as s:
        base = [str(entries["v1"]), "--url", s.grpc_url, "--ssl", "--root-cert", str(c["ca.pem"]), "--timeout", "10"]
        r = _cli("deploy", *base, env=env)  # no client certificate: refused
        assert r.returncode == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
        r = _cli("deploy", *base, "--client-cert", str(c["client.pem"]), "--client-key", str(c["client.key"]), env=env)
        assert r.returncode == 0, r.stderr
        assert "over TLS (mutual)" in r.stdout
        r = _cli("deploy", str(entries["v1"]), "--url", s.grpc_url, env=env)  # plaintext to a TLS port
        assert r.returncode == 1 and r.stderr.startswith("error: ")


def test_bench_cold_after_deploy_loads_the_upload_back(server, entries, env):
    """The documented flow (docs/serving.md): deploy, then measure cold starts. The model deploy uploaded is not in
    the server's repository; --cold loads it back from the copy deploy kept, and it still serves.
    Without that copy (MCP_STATE_KEEP=0) --cold refuses before unloading anything."""
    r = _cli("deploy", str(entries["v1"]), "--url", server.grpc_url, "--name", "coldmlp", env=env)
    assert r.returncode == 0, r.stderr
    r = _cli("bench", "coldmlp", "--url", server.grpc_url, "--cold", "--cold-runs", "1", "--json", env=env)
    assert r.returncode == 0, r.stderr
    cold = __import__("json").loads(r.stdout)["cold"]
    assert len(cold["runs"]) == 1
    # no --metrics-url: the --url's host, port 8002, as `status --metrics` (read, or a note that it was not)
    assert not any("no metrics URL" in n for n in cold["notes"]), cold["notes"]
    st = _cli("status", "--url", server.grpc_url, "--json", env=env)
    assert any(m["name"] == "coldmlp" and m["state"] == "READY" for m in __import__("json").loads(st.stdout)["models"])

    bare = {**env, "MCP_STATE_KEEP": "0"}
    r = _cli("deploy", str(entries["v1"]), "--url", server.grpc_url, "--name", "coldmlp2", env=bare)
    assert r.returncode == 0, r.stderr
    r = _cli("bench", "coldmlp2", "--url", server.grpc_url, "--cold", env=bare)
    assert r.returncode == 2 and "uploaded" in r.stderr and "no copy" in r.stderr, r.stderr
    st = _cli("status", "--url", server.grpc_url, "--json", env=env)
    assert any(m["name"] == "coldmlp2" and m["state"] == "READY" for m in __import__("json").loads(st.stdout)["models"])
    for n in ("coldmlp", "coldmlp2"):
        _cli("undeploy", n, "--url", server.grpc_url, env=env)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI needed to make test certificates")
def test_serve_with_mutual_tls_one_loop(tmp_path, entries, env):
    """`serve --tls-cert --tls-key --tls-client-ca`: the banner's grpcs:// URL and deploy line,
    then deploy -> status -> bench -> undeploy through it with the client certificate; without
    one the server refuses."""
    import os
    import re

    from _helpers import Serve

    c = _certs(tmp_path)
    repo = tmp_path / "served"
    shutil.copytree(entries["v1"], repo / "mlp")
    s = Serve([str(repo), "--tls-cert", str(c["server.pem"]), "--tls-key", str(c["server.key"]),
               "--tls-client-ca", str(c["ca.pem"])], dict(os.environ, **env))
    try:
        grpc = re.search(r"gRPC +(grpcs://\S+) \(TLS; mutual", s.out)
        assert grpc and "no TLS: Triton's HTTP has none" in s.out, s.out
        url = grpc.group(1)
        assert f"--url {url} --root-cert {c['ca.pem']} --client-cert CLIENT.pem --client-key CLIENT.key" in s.out
        tls = ["--url", url, "--root-cert", str(c["ca.pem"])]
        mine = ["--client-cert", str(c["client.pem"]), "--client-key", str(c["client.key"])]
        r = _cli("status", *tls, "--timeout", "10", env=env)   # no client certificate: refused, one line
        assert r.returncode == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
        r = _cli("deploy", str(entries["v2"]), "--name", "mlp2", *tls, *mine, env=env)
        assert r.returncode == 0 and "over TLS (mutual)" in r.stdout, r.stderr
        r = _cli("status", *tls, *mine, "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert {m["name"] for m in __import__("json").loads(r.stdout)["models"] if m["state"] == "READY"} == {"mlp", "mlp2"}
        r = _cli("bench", "mlp2", *tls, *mine, "-c", "1", "--seconds", "1", "--json", env=env)
        assert r.returncode == 0, r.stderr
        point = __import__("json").loads(r.stdout)["points"][0]
        assert point["throughput"] > 0 and point["errors"] == 0, point
        r = _cli("undeploy", "mlp2", *tls, *mine, env=env)
        assert r.returncode == 0, r.stderr
    finally:
        rc, out, err = s.stop()
    assert rc == 0, err
