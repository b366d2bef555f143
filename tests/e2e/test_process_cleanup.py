"""Hardening round 5 (issue 62): a killed tune, bench or serve never leaves its tritonserver or
python stub running. The server dies with its parent (PR_SET_PDEATHSIG, SIGKILL: tritonserver's
graceful stop after SIGTERM kept its ports and stubs for seconds more), and the next start kills
the servers and stubs of mcp-cli processes that are gone, as it removes their shared memory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import GOLDEN

pytestmark = pytest.mark.slow  # a real Triton

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver")

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
DEADLINE = 120.0   # what the behaviour is checked within, not a speed


def _of(pid: int) -> list[int]:
    """The processes (tritonserver, stubs) whose command line names the mcp-cli process `pid`."""
    mark = re.compile(rb"mcp-triton\.%d\.[0-9a-f]{6}\." % pid)
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if mark.search((d / "cmdline").read_bytes()):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def _state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode(errors="replace")
    except OSError:
        return f"{pid} (gone)"
    state = re.search(r"State:\s*(.*)", status)
    return f"{pid} {state.group(1) if state else '?'} {cmd}"


def _wait(cond, what, pid=None):
    end = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < end, f"{what}: {[_state(q) for q in _of(pid)] if pid else ''}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    d = tmp_path_factory.mktemp("cleanup")
    r = subprocess.run([*CLI, "convert", str(GOLDEN / "mlp" / "model.onnx"), "-t", "triton-v1.12", "-o", str(d),
                        "--name", "mlp"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return d / "mlp"


def _servers(pid: int) -> list[int]:
    out = []
    for q in _of(pid):
        try:
            if b"bin/tritonserver" in Path(f"/proc/{q}/cmdline").read_bytes():
                out.append(q)
        except OSError:
            continue
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("command", ["tune", "bench", "serve"])
def test_a_killed_command_leaves_no_server_or_stub(entry, tmp_path, command, sig):
    """Killed at the worst moment: as soon as the model's stub exists. SIGTERM: the command stops
    its server and stubs itself. SIGKILL: tritonserver dies with it (PR_SET_PDEATHSIG) and a
    stub that had loaded the model ends with its parent (mcp_runtime.lifetime); a stub killed
    before it read the model (its own start, where nothing of ours runs yet) is ended by the next
    server start of any mcp-cli (remove_stale_servers)."""
    from mcp_compiler.targets.triton.serve import remove_stale_servers

    args = {"tune": ["tune", str(entry), "--slo-p99-ms", "50"],
            "bench": ["bench", str(entry), "--seconds", "600"],
            "serve": ["serve", str(entry.parent), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]}
    p = subprocess.Popen([*CLI, *args[command]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        # the server and the model's stub up (two processes naming this command)
        _wait(lambda: len(_of(p.pid)) >= 2 or p.poll() is not None, f"{command}: no server started")
        assert p.poll() is None, f"{command} ended before it was killed"
        p.send_signal(sig)
        p.wait(DEADLINE)
        _wait(lambda: not _servers(p.pid), f"{command} killed by {sig.name}: its tritonserver still runs", p.pid)
        if sig == signal.SIGKILL:
            remove_stale_servers()   # what the next start does first
        _wait(lambda: not _of(p.pid), f"{command} killed by {sig.name}: its stub still runs", p.pid)
    finally:
        if p.poll() is None:
            p.kill()
        for pid in _of(p.pid):
            os.kill(pid, signal.SIGKILL)


def test_the_next_start_kills_the_servers_of_mcp_cli_processes_that_are_gone(tmp_path):
    from mcp_compiler.targets.triton.serve import remove_stale_servers

    gone = subprocess.Popen(["true"])
    gone.wait()   # a pid no process has now
    sleeper = "import time; time.sleep(600)"
    orphan = subprocess.Popen([sys.executable, "-c", sleeper, f"--backend-config=python,shm-region-prefix-name="
                                                              f"mcp-triton.{gone.pid}.abc123."])
    alive = subprocess.Popen([sys.executable, "-c", sleeper, f"mcp-triton.{os.getpid()}.abc123."])
    try:
        _wait(lambda: _of(gone.pid) and _of(os.getpid()), "the stand-ins did not start")
        killed = remove_stale_servers()
        assert orphan.pid in killed and alive.pid not in killed
        assert orphan.wait(DEADLINE) == -signal.SIGKILL
        assert alive.poll() is None   # a live mcp-cli process's server is left alone
    finally:
        for q in (orphan, alive):
            q.kill()
            q.wait()


def test_the_next_start_removes_the_folders_a_killed_server_left(entry, tmp_path):
    """A serve killed with SIGKILL left its `mcp-triton-*` folder in TMPDIR and Triton's python
    backend its `/tmp/python_env_*` (removed only when tritonserver stops): the next server start
    removes both (a folder kept on purpose for its log stays)."""
    from mcp_compiler.targets.triton.serve import KEPT, TritonServer, _tritonservers_running

    if _tritonservers_running():
        pytest.skip("another tritonserver of this user runs: its python_env_ folders are not ours to judge")
    envs_before = set(Path("/tmp").glob("python_env_*"))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([*CLI, "serve", str(entry.parent), "--http-port", "0", "--grpc-port", "0",
                          "--metrics-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        _wait(lambda: len(_of(p.pid)) >= 2 or p.poll() is not None, "serve: no server started")
        _wait(lambda: set(Path("/tmp").glob("python_env_*")) - envs_before or p.poll() is not None,
              "the python backend made no python_env_ folder")
        p.kill()
        p.wait(DEADLINE)
        _wait(lambda: not _servers(p.pid), "its tritonserver still runs", p.pid)
    finally:
        if p.poll() is None:
            p.kill()
    left = [d for d in tmp_path.glob("mcp-triton-*")]
    leaked = set(Path("/tmp").glob("python_env_*")) - envs_before
    assert left and leaked   # what SIGKILL leaves
    kept = tmp_path / "mcp-triton-1-kept"   # pid 1: alive, never ours to remove (and a kept one, too)
    kept.mkdir()
    (kept / KEPT).write_text("")
    import tempfile

    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    (tmp_path / "empty-repo").mkdir()
    try:
        with TritonServer(tmp_path / "empty-repo", explicit=True):
            pass
    finally:
        tempfile.tempdir = old
    assert not any(d.exists() for d in left) and kept.exists()
    assert not any(d.exists() for d in leaked)
    assert not _of(p.pid)   # a stub caught in its own start: killed by that start too
