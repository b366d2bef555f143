"""A real local Triton Inference Server (the tritonserver bundled in PyPI's nvidia-pytriton).

Facts this relies on (../shared/notes/triton.md): the python backend needs a backend folder of
our own (links to libtriton_python.so, its utils and the stub for this Python); the stub finds
the environment through `python3` on PATH; port 0 is refused, so free ports are picked and a
start that loses the race is retried; the server is bound to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mcp_compiler.errors import ServerError, UsageError

HOST = "127.0.0.1"


@dataclass(frozen=True)
class TritonInstall:
    server: Path
    python_backend: Path
    stub: Path


def find_triton() -> TritonInstall:
    """The tritonserver of the nvidia-pytriton wheel, or a clear error saying how to get it."""
    try:
        import pytriton
    except ImportError:
        raise UsageError("no Triton server found: install the serve extra "
                         "(pip install 'mcp-cli[serve]', which brings nvidia-pytriton)") from None
    root = Path(pytriton.__file__).parent / "tritonserver"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    inst = TritonInstall(root / "bin" / "tritonserver", root / "backends" / "python",
                         root / "python_backend_stubs" / ver / "triton_python_backend_stub")
    for p in (inst.server, inst.python_backend / "libtriton_python.so", inst.stub):
        if not p.exists():
            raise UsageError(f"nvidia-pytriton is installed but {p} is missing (Python {ver} unsupported?)")
    return inst


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free ports: the sockets are held together while picking (free_port() twice in a
    row may return the same port, and tritonserver refuses HTTP and metrics on one port)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


SHM_PREFIX = "mcp-triton."


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Until each process has ended (gone, or a zombie its new parent has yet to reap)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                break
            if state in (b"Z", b"X"):
                break
            time.sleep(0.02)


def remove_stale_regions() -> None:
    """Shared-memory regions of servers whose mcp-cli process is gone (killed before it could
    remove them): `mcp-triton.<pid>.` names the process that started the server."""
    from mcp_compiler.files import pid_alive

    for region in Path("/dev/shm").glob(f"{SHM_PREFIX}*"):
        pid = region.name[len(SHM_PREFIX):].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                region.unlink()


def remove_stale_servers() -> list[int]:
    """Kill the tritonservers and python stubs of mcp-cli processes that are gone (a tune, bench
    or serve killed before it could stop its server, where _die_with_parent did not act: a
    kernel without it, a server started from a thread that ended): each names its mcp-cli
    process in its command line (the shm region prefix, `mcp-triton.<pid>.<random>.`). Only
    this user's processes; the pids killed."""
    import re

    from mcp_compiler.files import pid_alive

    mark = re.compile(rb"mcp-triton\.(\d+)\.[0-9a-f]{6}\.")
    killed = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            found = mark.search((d / "cmdline").read_bytes())
            if found is None or d.stat().st_uid != os.getuid() or pid_alive(int(found.group(1))):
                continue
            os.kill(int(d.name), signal.SIGKILL)
            killed.append(int(d.name))
        except (OSError, ValueError):
            continue
    return killed


KEPT = "kept"   # in a server's temp folder: kept on purpose (an error message names its log)


def remove_stale_folders(tmp: Path | None = None) -> list[Path]:
    """What servers of mcp-cli processes that are gone (killed: SIGKILL) left in the temp folder:
    their `mcp-triton-<pid>-*` folders (unless kept on purpose for their log: KEPT), and, when no
    tritonserver of this user runs at all, the empty `/tmp/python_env_*` folders Triton's python
    backend makes (at a fixed place) and removes only when it stops. The paths removed."""
    import tempfile

    from mcp_compiler.files import pid_alive

    tmp = Path(tmp or tempfile.gettempdir())
    removed = []
    for d in tmp.glob("mcp-triton-*-*"):
        pid = d.name[len("mcp-triton-"):].split("-", 1)[0]
        with contextlib.suppress(OSError):
            if (pid.isdigit() and not pid_alive(int(pid)) and d.is_dir() and not d.is_symlink()
                    and d.stat().st_uid == os.getuid() and not (d / KEPT).exists()):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    if not _tritonservers_running():
        for d in Path("/tmp").glob("python_env_*"):
            with contextlib.suppress(OSError):
                if d.is_dir() and not d.is_symlink() and d.stat().st_uid == os.getuid() and not any(d.iterdir()):
                    d.rmdir()
                    removed.append(d)
    return removed


def _tritonservers_running() -> bool:
    """Whether any tritonserver of this user runs (theirs may own a python_env_ folder)."""
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if d.stat().st_uid == os.getuid() and b"tritonserver" in (d / "cmdline").read_bytes().split(b"\0")[0]:
                return True
        except OSError:
            continue
    return False


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: the server must not outlive a crashed or killed test or CLI process.
    # SIGKILL, not SIGTERM: there is no one left to serve, and tritonserver's graceful stop kept
    # its ports and stubs for 5 s more after a killed tune (its stubs end within 0.5 s of it).
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


TRACE_LEVELS = ("TIMESTAMPS", "TENSORS")


def _collector_url(value: str) -> str:
    """An OTLP/HTTP collector's URL, checked whole before the server starts (a malformed one
    killed the relay's forwarding thread later: metrics.http_url's rules); /v1/traces added when
    no path is given."""
    from urllib.parse import urlsplit

    from .metrics import http_url

    url = http_url(value, f"--trace otlp={value.strip()!r}")
    if urlsplit(url).path in ("", "/"):
        url = url.rstrip("/") + "/v1/traces"
    return url


@dataclass
class Trace:
    """`serve --trace`: where spans go (an OTLP/HTTP collector, or a file), how often Triton
    samples a request (1 in `rate`) and what it records (`level`)."""

    otlp: str | None = None      # http://HOST:PORT/v1/traces
    file: Path | None = None
    rate: int = 1
    level: str = "TIMESTAMPS"

    @classmethod
    def parse(cls, spec: str, rate: int = 1, level: str = "TIMESTAMPS", force: bool = False) -> Trace:
        kind, sep, value = spec.partition("=")
        if not sep or not value.strip() or kind not in ("otlp", "file"):
            raise UsageError(f"--trace {spec!r}: expected otlp=http://HOST:PORT[/v1/traces] or file=PATH")
        if not 1 <= rate <= 2**31 - 1:
            raise UsageError(f"--trace-rate must be between 1 and {2**31 - 1} (one request in N is traced), got {rate}")
        if level.upper() not in TRACE_LEVELS:
            raise UsageError(f"--trace-level must be TIMESTAMPS or TENSORS, got {level!r}")
        if kind == "file":
            from mcp_compiler.files import check_output

            path = Path(value)
            check_output(path, "--trace file=", force=force)   # an existing trace is kept unless --force
            return cls(file=path, rate=rate, level=level.upper())
        return cls(otlp=_collector_url(value), rate=rate, level=level.upper())

    def args(self, via: str | None = None) -> list[str]:
        """Triton's own trace settings: OpenTelemetry mode to the collector (or to `via`, the local
        relay that forwards to it), or Triton's JSON file."""
        from mcp_compiler import __version__

        common = ["--trace-config", f"rate={self.rate}", "--trace-config", f"level={self.level}"]
        if self.otlp:
            return ["--trace-config", "mode=opentelemetry", *common,
                    "--trace-config", f"opentelemetry,url={via or self.otlp}",
                    "--trace-config", "opentelemetry,resource=service.name=mcp-cli",
                    "--trace-config", f"opentelemetry,resource=mcp_cli.version={__version__}"]
        return ["--trace-config", "mode=triton", *common, "--trace-config", f"triton,file={self.file}",
                "--trace-config", "triton,log-frequency=1"]

    def env(self, via: str | None = None) -> dict[str, str]:
        """What the runtime in each stub reads (mcp_runtime.telemetry)."""
        from mcp_compiler import __version__

        out = {"MCP_CLI_VERSION": __version__, "MCP_TRACE_SERVICE": "mcp-cli"}
        if self.otlp:
            out["MCP_TRACE_OTLP"] = via or self.otlp
        else:
            out["MCP_TRACE_FILE"] = str(self.file)
            out["MCP_TRACE_RATE"] = str(self.rate)
        return out


class TritonServer:
    """Start/stop a tritonserver on 127.0.0.1; use as a context manager."""

    def __init__(self, repository: str | os.PathLike, *, explicit: bool = False, mode: str | None = None,
                 load_all: bool = False, http_port: int | None = None, grpc_port: int | None = None,
                 metrics_port: int | None = None, extra_args: list[str] | None = None,
                 log_path: str | os.PathLike | None = None, startup_timeout: float = 60.0,
                 trace: Trace | None = None) -> None:
        """Ports: None or 0 picks free ones; a port given is used or the start fails naming it
        (a server on other ports than asked would have clients talk to another server).

        mode: Triton's model control, "none" (every model loaded, no repository API), "explicit"
        (the repository API; with load_all every model is loaded at start, else none) or "poll";
        `explicit=True` is mode "explicit"."""
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise UsageError(f"model repository {repository} is not a directory")
        self.mode = mode or ("explicit" if explicit else "none")
        if self.mode not in ("none", "explicit", "poll"):
            raise ValueError(f"model control mode {self.mode!r}")
        self.load_all = load_all
        self.http_port, self.grpc_port, self.metrics_port = http_port or None, grpc_port or None, metrics_port or None
        self.trace = trace
        self.relay = None   # the local OTLP relay to the collector (trace_relay), while serving
        self.extra_args = list(extra_args or [])
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix=f"mcp-triton-{os.getpid()}-"))   # (the pid: remove_stale_folders)
        self.log_path = Path(log_path) if log_path else self._tmp / "server.log"
        # the python backend's shared-memory regions are named with this prefix (its
        # shm-region-prefix-name): this server's are found and removed however it ended
        self.shm_prefix = f"{SHM_PREFIX}{os.getpid()}.{os.urandom(3).hex()}."
        self.died: int | None = None   # the exit code of a server that ended without stop()

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"{HOST}:{self.metrics_port}"

    def _backend_dir(self, inst: TritonInstall) -> Path:
        bk = self._tmp / "backends" / "python"
        bk.mkdir(parents=True, exist_ok=True)
        for src in (inst.python_backend / "libtriton_python.so",
                    inst.python_backend / "triton_python_backend_utils.py", inst.stub):
            dst = bk / src.name
            if not dst.exists():
                dst.symlink_to(src)
        return bk.parent

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The stub runs `python3` from PATH: this interpreter's environment, numpy<2 included.
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
        for k in ("MCP_TRACE_OTLP", "MCP_TRACE_FILE", "MCP_TRACE_RATE"):   # only what this server was asked to trace
            env.pop(k, None)
        if self.trace:
            env.update(self.trace.env(self.relay.url if self.relay else None))
        return env

    def _trace_args(self) -> list[str]:
        """Triton's trace flags; spans for a collector go through a local relay (trace_relay) that
        answers at once and forwards, so that a slow or dead collector costs no request."""
        if self.trace is None:
            return []
        if self.trace.otlp and self.relay is None:
            from .trace_relay import TraceRelay

            self.relay = TraceRelay(self.trace.otlp).start()
        return self.trace.args(self.relay.url if self.relay else None)

    def start(self) -> TritonServer:
        try:
            return self._start()
        except BaseException:
            if self.relay is not None:   # a server that never started leaves no relay behind
                self.relay.close(drain=0)
                self.relay = None
            raise

    def _start(self) -> TritonServer:
        remove_stale_servers()   # (before their regions: a live stub keeps a region mapped)
        remove_stale_regions()
        remove_stale_folders(self._tmp.parent)
        inst = find_triton()
        backends = self._backend_dir(inst)
        given = {flag: port for flag, port in (("--http-port", self.http_port), ("--grpc-port", self.grpc_port),
                                               ("--metrics-port", self.metrics_port)) if port}
        for flag, port in given.items():
            if not port_free(port):
                raise UsageError(f"{flag} {port}: the port is in use on {HOST}")
        for attempt in range(5):
            picked = iter(free_ports(6))
            taken = set(given.values())
            http, grpc, metrics = (p or next(x for x in picked if x not in taken)
                                   for p in (self.http_port, self.grpc_port, self.metrics_port))
            args = [str(inst.server), f"--model-repository={self.repository}",
                    f"--backend-directory={backends}",
                    f"--model-control-mode={self.mode}",
                    *(["--load-model=*"] if self.mode == "explicit" and self.load_all else []),
                    *(["--repository-poll-secs=2"] if self.mode == "poll" else []),
                    f"--http-address={HOST}", f"--http-port={http}",
                    f"--grpc-address={HOST}", f"--grpc-port={grpc}",
                    f"--metrics-address={HOST}", f"--metrics-port={metrics}",
                    "--exit-timeout-secs=5", "--allow-gpu-metrics=false",
                    "--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size=0:0",
                    f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
                    *self._trace_args(), *self.extra_args]
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self._env(),
                                         preexec_fn=_die_with_parent, start_new_session=True)
            log.close()
            self.died = None   # (a retry after a lost port race: the last try's end is not this one's)
            self.http_port, self.grpc_port, self.metrics_port = http, grpc, metrics
            try:
                self._wait_ready()
                return self
            except ServerError:
                rc = self.proc.poll()
                text = self.log()
                self.stop()
                if rc is not None and "already in use" in text:
                    if given:  # a port the user gave was taken between our check and the bind
                        raise UsageError(f"{', '.join(f'{k} {v}' for k, v in given.items())}: "
                                         f"a port is in use on {HOST}") from None
                    if attempt < 4:  # lost the race for a free port: pick others
                        self.http_port, self.grpc_port, self.metrics_port = None, None, None
                        continue
                raise
        raise ServerError("tritonserver could not bind free ports after 5 tries")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"tritonserver exited with code {self.proc.returncode}: "
                                  f"{self._last_error()} (log: {self.log_path})")
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        raise ServerError(f"tritonserver not ready after {self.startup_timeout:.0f} s: "
                          f"{self._last_error()} (log: {self.log_path})")

    def models(self) -> list[dict]:
        """The repository index: name, version, state and reason of every model."""
        import json

        req = urllib.request.Request(f"http://{self.http_url}/v2/repository/index", data=b"{}",
                                     method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _last_error(self) -> str:
        lines = [ln for ln in self.log().splitlines() if ln.startswith("E") or "error" in ln.lower()]
        return lines[-1].strip() if lines else "no error in its log"

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server; then what outlives a server that died (killed, crashed): its
        python-backend stubs, reparented to init, and their shared-memory regions."""
        if self.proc is None:
            return
        if self.alive():   # else: one that ended by itself, recorded in `died`
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        stubs = self._stubs()
        for pid in stubs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(stubs, 10.0)   # not our children: their end is watched, not waited for
        for region in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            with contextlib.suppress(OSError):
                region.unlink()

    def alive(self) -> bool:
        """Whether the server still runs; one that ended by itself is recorded in `died`."""
        if self.proc is None or self.proc.poll() is None:
            return self.proc is not None
        if self.died is None:
            self.died = self.proc.returncode
        return False

    def _stubs(self) -> list[int]:
        """The processes still running this server's models: their command line names its region."""
        found = []
        for d in Path("/proc").glob("[0-9]*"):
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if self.shm_prefix.encode() in cmd and int(d.name) != os.getpid():
                found.append(int(d.name))
        return found

    def close(self, *, keep_log: bool = False) -> None:
        """Stop the server and remove its temporary folder (backend links, log), unless
        keep_log (when a failure message names the log) or the server died by itself (the error
        that says so names its log)."""
        self.stop()
        if self.relay is not None:
            self.relay.close()
        if not (keep_log or self.died is not None):
            shutil.rmtree(self._tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                (self._tmp / KEPT).write_text("kept for its log: an error message names it\n")

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
