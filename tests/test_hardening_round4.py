"""Hardening, round 4 (issue 46): names that would become paths, tampered entries, state settings
checked before the server is touched, a corrupt .mcpir in verify. None of these needs a server:
each is refused before a connection is made (the URL points at a closed port on 127.0.0.1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import GOLDEN, closed_port, one_error

from mcp_compiler import CompileOptions, compile_model

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
MLP = GOLDEN / "mlp" / "model.onnx"



def _cli(*args: str, env: dict | None = None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


_one_error = one_error


@pytest.fixture(scope="module")
def entry(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("entry")
    compile_model(MLP, d / "repo", CompileOptions.for_target("triton-v1.12", "mlp"))
    return d / "repo" / "mlp"


@pytest.fixture
def state(tmp_path) -> dict:
    victim = tmp_path / "victim" / "keep"
    victim.mkdir(parents=True)
    (victim / "file").write_text("precious")
    return dict(os.environ, MCP_STATE_DIR=str(tmp_path / "a" / "b" / "state"))


@pytest.mark.parametrize("name", ["../../../../victim", "/tmp/x", ".", "..", "a/b", "mlp\n", "-x", "ok\x01"])
def test_deploy_name_never_becomes_a_path(entry, state, tmp_path, name):
    r = _cli("deploy", str(entry), "--url", f"grpc://127.0.0.1:{closed_port()}", "--name", name, env=state)
    _one_error(r, 2, "--name", "not accepted")
    assert (tmp_path / "victim" / "keep" / "file").read_text() == "precious"
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("name", ["../../../../victim", "."])
def test_a_tampered_config_name_is_refused_before_sending(entry, state, tmp_path, name):
    bad = tmp_path / "dl" / "mlp"
    shutil.copytree(entry, bad)
    cfg = bad / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('name: "mlp"', f'name: "{name}"'))
    for args in (["deploy", str(bad), "--url", f"grpc://127.0.0.1:{closed_port()}"],
                 ["deploy", str(bad), "--url", f"grpc://127.0.0.1:{closed_port()}", "--dry-run"]):
        r = _cli(*args, env=state)
        _one_error(r, 2, "config.pbtxt", "not accepted")
    assert (tmp_path / "victim" / "keep" / "file").read_text() == "precious"


def test_undeploy_name_is_checked(state, tmp_path):
    r = _cli("undeploy", "../../../../victim", "--url", f"grpc://127.0.0.1:{closed_port()}", env=state)
    _one_error(r, 2, "not accepted")
    assert (tmp_path / "victim" / "keep" / "file").exists()


def test_state_keep_is_checked_before_the_server(entry, state):
    r = _cli("deploy", str(entry), "--url", f"grpc://127.0.0.1:{closed_port()}", env={**state, "MCP_STATE_KEEP": "abc"})
    _one_error(r, 2, "MCP_STATE_KEEP")


@pytest.mark.parametrize("tamper, expect", [
    ("utf8", "not UTF-8"),
    ("superscript", "no version folder"),
    ("huge_config", "over the"),
])
def test_tampered_entries_are_one_error_line(entry, tmp_path, tamper, expect):
    bad = tmp_path / "t" / "mlp"
    shutil.copytree(entry, bad)
    if tamper == "utf8":
        (bad / "config.pbtxt").write_bytes(b'name: "ml\xffp"\n' + (bad / "config.pbtxt").read_bytes())
    elif tamper == "superscript":
        (bad / "1").rename(bad / "\u00b2")   # '²'.isdigit() is True, but it names no version
    else:
        with open(bad / "config.pbtxt", "r+b") as f:
            f.truncate(1 << 40)   # a sparse terabyte: refused from its size, never read
    for args in (["deploy", str(bad), "--url", f"grpc://127.0.0.1:{closed_port()}", "--dry-run"],
                 ["verify", str(MLP), str(bad)]):
        r = _cli(*args)
        _one_error(r, 2, expect)


def test_arabic_indic_version_folder_is_no_version(entry, tmp_path):
    from mcp_compiler.targets.triton.entry import version_dirs

    bad = tmp_path / "t" / "mlp"
    shutil.copytree(entry, bad)
    shutil.copytree(bad / "1", bad / "\u0663")   # '٣'
    assert [v for v, _ in version_dirs(bad)] == [1]


@pytest.mark.parametrize("cut", ["truncated", "garbage"])
def test_verify_of_a_corrupt_mcpir_is_an_input_error(entry, tmp_path, cut):
    bad = tmp_path / "c" / "mlp"
    shutil.copytree(entry, bad)
    f = bad / "1" / "model.mcpir"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if cut == "truncated" else b"\x00" * len(data))
    r = _cli("verify", str(MLP), str(bad))
    _one_error(r, 2, "model.mcpir")


@pytest.mark.parametrize("suffix", [".mcpir", ".onnx"])
def test_a_killed_writes_temp_is_removed_by_the_next_write(tmp_path, suffix):
    """A convert killed mid-write leaves `.NAME.PID.*` beside the output; the next write to the
    same place removes it (its pid is gone), and never a live writer's."""
    import subprocess as sp

    dead = sp.Popen(["true"])
    dead.wait()
    out = tmp_path / f"m{suffix}"
    stale = tmp_path / f".m{suffix}.{dead.pid}.abc.tmp"
    stale.write_bytes(b"x" * 4096)
    live = tmp_path / f".m{suffix}.{os.getpid()}.def.tmp"
    live.write_bytes(b"y")
    r = _cli("convert", str(MLP), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.exists() and not stale.exists() and live.exists()


@pytest.mark.parametrize("args, flag", [
    (["bench", "x/y", "--seconds", "inf"], "--seconds"),
    (["bench", "x/y", "--window-s", "nan"], "--window-s"),
    (["tune", "x/y", "--slo-p99-ms", "5", "--budget-s", "inf"], "--budget-s"),
    (["tune", "x/y", "--slo-p99-ms", "nan"], "--slo-p99-ms"),
    (["bench", "x/y", "--cold-runs", "\u0663"], "--cold-runs"),            # '٣': an Arabic-Indic 3
    (["convert", str(MLP), "--opset", "\u0661\u0667"], "--opset"),
])
def test_numbers_are_finite_and_ascii_on_every_flag(args, flag):
    r = _cli(*args)
    _one_error(r, 2, flag)


def test_comma_separated_numbers_are_ascii_too(entry):
    r = _cli("bench", str(entry), "-c", "\u0663")
    _one_error(r, 2, "-c")


@pytest.mark.parametrize("url, expect", [
    ("file:///etc/passwd", "scheme 'file'"),
    ("javascript:alert(1)", "expected http://HOST:PORT"),
    ("http://user:hunter2@127.0.0.1:8002", "credentials"),
    ("http://127.0.0.1:80\n02", "no spaces or newlines"),
    ("http://[::1", "expected http://HOST:PORT"),
])
def test_metrics_url_is_checked_before_the_server_and_never_echoes_credentials(url, expect):
    r = _cli("status", "--url", f"grpc://127.0.0.1:{closed_port()}", "--metrics", "--metrics-url", url)
    _one_error(r, 2, "--metrics-url", expect)
    assert "hunter2" not in r.stderr


@pytest.mark.parametrize("spec", ["otlp=http://[::1", "otlp=http://127.0.0.1:43\n18", "otlp=http://u:p@127.0.0.1:4318",
                                  "otlp=ftp://127.0.0.1:4318"])
def test_serve_refuses_a_malformed_collector_before_starting(tmp_path, spec):
    r = _cli("serve", str(tmp_path), "--trace", spec)
    _one_error(r, 2, "--trace otlp=")


def test_serve_keeps_an_existing_trace_file_without_force(tmp_path):
    old = tmp_path / "trace.json"
    old.write_text("keep")
    r = _cli("serve", str(tmp_path), "--trace", f"file={old}")
    _one_error(r, 2, "exists", "--force")
    assert old.read_text() == "keep"


def test_nan_and_huge_metric_values_are_no_counts():
    from mcp_compiler.targets.triton import metrics

    body = ('nv_inference_request_success{model="m",version="1"} NaN\n'
            'nv_inference_request_failure{model="m",version="1"} 1e400\n'
            'nv_inference_count{model="m",version="1"} 7\n')
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        got = metrics.scrape(f"http://127.0.0.1:{srv.server_address[1]}")
    finally:
        srv.shutdown()
    assert [(n, v) for n, _, v in got] == [("nv_inference_count", 7.0)]


def test_bench_that_completed_nothing_is_a_failure_not_zero_req_s(monkeypatch, entry):
    """A model whose request outlasts the windows: 0 requests, 0 errors was exit 0 with 0.0 req/s."""
    from typer.testing import CliRunner

    from mcp_compiler.cli import app
    from mcp_compiler.targets.triton import bench
    from mcp_compiler.targets.triton.loadgen import Point

    empty = Point("c1", 1, None, 1, 0, 34.0, 0.0, 0.0, None, None, None, None, 0, 0, None, None, None, None,
                  0.01, 3, None)
    monkeypatch.setattr(bench, "bench", lambda *a, **k: bench.BenchReport("m", "grpc://127.0.0.1:1", 1, [empty], []))
    r = CliRunner().invoke(app, ["bench", "m", "--url", "grpc://127.0.0.1:1", "-c", "1"])
    assert r.exit_code == 1 and "completed no request" in r.output, r.output


def test_tune_names_the_closest_trial_when_none_met_the_slo():
    from types import SimpleNamespace as NS

    from mcp_compiler.targets.triton.commands_measure import _closest
    from mcp_compiler.targets.triton.tune import Setting

    def trial(p99, rps, **kw):
        return NS(setting=Setting(**{"dynamic_batching": False, "max_batch_size": 0, **kw}),
                  point=NS(p99_ms=p99, throughput=rps))

    r = NS(baseline=trial(40.0, 10.0), trials=[trial(12.0, 26.0, instance_count=2), trial(30.0, 5.0)])
    text = _closest(r)
    assert text.startswith("no trial met the SLO; the closest was") and "p99 12.0 ms, 26.0 req/s" in text
    assert "2 instance(s)" in text


def test_a_state_folder_that_cannot_be_made_is_refused_before_the_server(entry, tmp_path):
    blocker = tmp_path / "state-is-a-file"
    blocker.write_text("x")
    env = dict(os.environ, MCP_STATE_DIR=str(blocker / "sub"))
    r = _cli("deploy", str(entry), "--url", f"grpc://127.0.0.1:{closed_port()}", env=env)
    _one_error(r, 2, "state folder", "not a folder")
    assert blocker.read_text() == "x"


@pytest.mark.slow
def test_serve_that_exits_1_on_a_broken_model_leaves_no_temp_folder(entry, tmp_path):
    pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver")
    from _helpers import raising_copy

    repo = tmp_path / "repo"
    raising_copy(entry, repo / "broken", "initialize", "no weights here")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir))
    r = subprocess.run([*CLI, "serve", str(repo), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1 and "failed to load" in r.stderr, r.stderr
    assert not list(tmpdir.glob("mcp-triton-*")), list(tmpdir.iterdir())


def test_deploy_help_keeps_its_brackets():
    env = dict(os.environ, COLUMNS="100", TERM="dumb")
    r = subprocess.run([*CLI, "deploy", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "mcp-cli[kube]" in r.stdout, r.stdout


def test_ctrl_c_while_the_modules_load_is_one_line():
    """SIGINT in the first ~50 ms (while numpy, onnx, typer load) was a 24-line traceback; one
    while typer parsed was exit 130 with nothing said (typer's own silent Exit(130)); one inside
    onnx's C++ module initialisation aborted the process ('terminate called ...')."""
    import re
    import signal
    import time

    for delay in (0.05, 0.1, 0.12, 0.14, 0.15, 0.16, 0.2, 0.3):
        p = subprocess.Popen([*CLI, "convert", str(MLP), "-o", "/dev/null/x.mcpir"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        if "Remainder of file ignored" in err or ("Traceback" in err and not re.search(r'File ".*/mcp_compiler/', err)):
            continue   # the interpreter's own start (site, its .pth files, the console script's first line)
        assert "Traceback" not in err and p.returncode >= 0, (delay, p.returncode, err)   # no abort, no crash
        if p.returncode == 130:
            assert err.strip().splitlines()[-1] == "error: interrupted", (delay, err)


def test_a_pem_of_another_kind_is_not_a_certificate(tmp_path):
    from _tls import server_pair

    cert, key = server_pair(tmp_path)
    r = _cli("status", "--url", f"grpcs://127.0.0.1:{closed_port()}", "--root-cert", str(key))
    _one_error(r, 2, "holds no CERTIFICATE block", "PRIVATE KEY")
    r = _cli("status", "--url", f"grpcs://127.0.0.1:{closed_port()}", "--root-cert", str(cert),
             "--client-cert", str(cert), "--client-key", str(cert))
    _one_error(r, 2, "key file", "holds no PRIVATE KEY block")


def test_zoo_onnx_outputs_follow_the_umask(tmp_path):
    (tmp_path / "m.onnx").write_bytes(MLP.read_bytes())
    (tmp_path / "zoo.yaml").write_text("models:\n  - name: m\n    target: onnx\n    source: {path: m.onnx}\n")
    old = os.umask(0o022)
    try:
        for _ in range(2):   # converted, then installed from the cache
            r = subprocess.run([*CLI, "zoo", "zoo.yaml", "-o", "out", "--cache", "cache", "--force"] if _ else
                               [*CLI, "zoo", "zoo.yaml", "-o", "out", "--cache", "cache"],
                               cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            assert (tmp_path / "out" / "m.onnx").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_bench_cold_to_an_unreachable_server_is_one_line(entry):
    for target in (str(entry), "mlp"):
        r = _cli("bench", target, "--cold", "--url", f"grpc://127.0.0.1:{closed_port()}")
        _one_error(r, 1, "cannot reach Triton")


def test_serve_tls_files_are_checked_before_the_server_starts(tmp_path):
    from _tls import server_pair

    cert, key = server_pair(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    for args, expect in (
            (["--tls-cert", str(cert)], ("--tls-cert and --tls-key go together",)),
            (["--tls-client-ca", str(cert)], ("--tls-client-ca needs --tls-cert",)),
            (["--tls-cert", str(key), "--tls-key", str(key)], ("holds no CERTIFICATE block", "PRIVATE KEY")),
            (["--tls-cert", str(cert), "--tls-key", str(cert)], ("key file", "holds no PRIVATE KEY block")),
            (["--tls-cert", str(cert), "--tls-key", str(tmp_path / "none.key")], ("does not exist",)),
            (["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(key)], ("holds no CERTIFICATE",))):
        r = _cli("serve", str(repo), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *args)
        _one_error(r, 2, *expect)


def _processes_naming(text: str) -> list[int]:
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if text.encode() in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except OSError:
            continue
    return out


@pytest.mark.slow
@pytest.mark.parametrize("command", [["bench", "-c", "1", "--seconds", "60"],
                                     ["tune", "--slo-p99-ms", "50", "--concurrency", "1", "--budget-s", "300"]])
def test_a_server_killed_mid_measurement_is_the_commands_error_and_leaves_nothing(entry, tmp_path, command):
    """tritonserver killed (-9) while bench or tune measures through it: exit 1 naming the server's
    end (not a point of failed requests, not an SLO missed), its stubs and shared memory gone."""
    import time

    pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver")
    repo = tmp_path / "repo"
    shutil.copytree(entry, repo / "mlp")
    p = subprocess.Popen([*CLI, command[0], str(repo / "mlp"), *command[1:]], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        import re
        import urllib.request

        deadline = time.monotonic() + 180
        server, ready = [], False
        while time.monotonic() < deadline and not ready:   # the model READY: the measurement runs
            server = [pid for pid in _processes_naming(str(repo))
                      if "tritonserver" in Path(f"/proc/{pid}/cmdline").read_text()]
            if server:
                port = re.search(r"--http-port=(\d+)", Path(f"/proc/{server[0]}/cmdline").read_text().replace("\0", " "))
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/v2/models/mlp/ready", timeout=2) as r:
                        ready = r.status == 200
                except (OSError, AttributeError):
                    pass
            time.sleep(0.2)
        assert ready, "the model never became READY"
        time.sleep(1)
        os.kill(server[0], 9)
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]   # after bench's and tune's progress
    assert p.returncode == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert "tritonserver exited with code -9" in errors[0] and err.rstrip().endswith(errors[0]), err
    assert not _processes_naming(f"mcp-triton.{p.pid}."), "a python-backend stub outlived the server"
    assert not list(Path("/dev/shm").glob(f"mcp-triton.{p.pid}.*")), "its shared memory is left"


@pytest.mark.slow
def test_1000_seeded_hostile_runs_of_the_serving_commands_end_cleanly(entry, tmp_path):
    """tests/_fuzz_serving.py: deploy, deploy --kserve, bench, tune, status, serve and undeploy with
    random subsets of their flags at hostile values: every run exits 0, 1, 2 or 130 within 30 s,
    with no internal error and no traceback."""
    import json

    shutil.copytree(entry, tmp_path / "repo" / "mlp")
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "_fuzz_serving.py"), "1", "1000", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, env=dict(os.environ, GRPC_VERBOSITY="NONE"),
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    assert found["runs"] == 1000 and sum(found["codes"].values()) == 1000
    assert not found["bad"], json.dumps(found["bad"][:5], indent=1)[:4000]


def test_status_metrics_count_the_runtimes_errors_as_failures():
    """Triton counts a python-backend error response as a success: 7953 ok next to 7953 runtime
    errors was what status --metrics showed."""
    from mcp_compiler.targets.triton import metrics

    samples = [("nv_inference_request_success", {"model": "m", "version": "1"}, 7953.0),
               ("nv_inference_request_failure", {"model": "m", "version": "1"}, 2.0),
               ("mcp_runtime_errors_total", {"model": "m", "version": "1"}, 7950.0)]
    s = metrics.summary(metrics.by_model(samples)[("m", "1")])
    assert (s["success"], s["failure"], s["runtime_errors"]) == (3, 7952, 7950.0)
    plain = metrics.summary(metrics.by_model(samples[:2])[("m", "1")])
    assert (plain["success"], plain["failure"]) == (7953, 2)
