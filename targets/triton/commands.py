"""The Triton target's commands: serve, verify, deploy, status, undeploy, bench, tune.

Registered on the mcp-cli app through `TritonTarget.commands()`; each parses its options, calls
this package's library code, and renders through the shared reporter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from mcp_compiler.cli.common import Choice, DebugOpt, JsonOpt, examples, one_model, parse_dims, reporter, run
from mcp_compiler.errors import ServerError, UsageError

TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}   # tritonserver's own defaults


def command(name: str, *lines: str | tuple[str, ...]) -> Callable[[Callable], Callable]:
    def mark(fn: Callable) -> Callable:
        fn.__command_name__, fn.__examples__ = name, examples(*lines) if lines else None
        return fn
    return mark


class Protocol(Choice):
    grpc = "grpc"
    http = "http"


@command("serve", "mcp-cli serve model_repository",
         "mcp-cli serve model_repository --grpc-port 0 --json",
         "mcp-cli serve model_repository --allow-unavailable",
         "mcp-cli serve model_repository --no-load    # start empty, for `deploy`",
         ("mcp-cli serve repo --tls-cert server.pem --tls-key server.key",
          "  --tls-client-ca ca.pem"))
def serve(
    repository: Path = typer.Argument(..., help="The model repository folder."),
    http_port: Optional[int] = typer.Option(None, "--http-port", min=0, max=65535,
                                            help="Default: 8000, or a free port if 8000 is taken; 0: a free port."),
    grpc_port: Optional[int] = typer.Option(None, "--grpc-port", min=0, max=65535,
                                            help="Default: 8001, or a free port if taken; 0: a free port."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", min=0, max=65535,
                                               help="Default: 8002, or a free port if taken; 0: a free port."),
    load: bool = typer.Option(True, "--load/--no-load", help="Load every model of the repository at start "
                              "(default); --no-load starts with none loaded."),
    explicit: bool = typer.Option(False, "--explicit", hidden=True, help="Same as --no-load (the older spelling)."),
    poll: bool = typer.Option(False, "--poll", help="Triton's poll mode instead: the repository folder is "
                              "watched for changes, and deploy/undeploy are refused by the server."),
    allow_unavailable: bool = typer.Option(False, "--allow-unavailable", help="Keep serving when a model "
                                           "fails to load (default: stop, exit 1, naming each one and why)."),
    trace: Optional[str] = typer.Option(None, "--trace", metavar="otlp=URL|file=PATH", rich_help_panel="Tracing",
                                        help="OpenTelemetry traces: Triton's spans and the runtime's under them, to "
                                        "an OTLP/HTTP collector (otlp=http://HOST:4318), or to files (file=PATH: "
                                        "Triton's JSON trace, the runtime's spans in PATH.runtime.jsonl)."),
    trace_rate: int = typer.Option(1, "--trace-rate", rich_help_panel="Tracing",
                                   help="Trace one request in N."),
    trace_level: str = typer.Option("TIMESTAMPS", "--trace-level", metavar="TIMESTAMPS|TENSORS",
                                    rich_help_panel="Tracing", help="What Triton records in its spans."),
    force: bool = typer.Option(False, "--force", rich_help_panel="Tracing",
                               help="Replace an existing --trace file=PATH."),
    tls_cert: Optional[Path] = typer.Option(None, "--tls-cert", rich_help_panel="TLS", dir_okay=False,
                                            help="The server's certificate (PEM): gRPC over TLS (grpcs://). "
                                            "Triton's HTTP endpoint has no TLS: it stays on 127.0.0.1 only."),
    tls_key: Optional[Path] = typer.Option(None, "--tls-key", rich_help_panel="TLS", dir_okay=False,
                                           help="The private key of --tls-cert (PEM)."),
    tls_client_ca: Optional[Path] = typer.Option(None, "--tls-client-ca", rich_help_panel="TLS", dir_okay=False,
                                                 help="Mutual TLS: only clients with a certificate this CA "
                                                 "signed are served (deploy/status/bench --client-cert)."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Start a local Triton Inference Server on 127.0.0.1 for REPOSITORY (Ctrl-C stops it, exit 0).

    Every model of the repository is loaded, and the server accepts `deploy`/`undeploy` for more
    (Triton's explicit model control with every model loaded at start). A model that fails to
    load stops it with one line per model and exit 1, unless --allow-unavailable. A port you give
    that is taken is an error; the defaults are Triton's own (8000, 8001, 8002), each replaced by a
    free port when taken. With --json, one JSON object when the server is ready (its URLs and
    models), then it serves until stopped.

    --tls-cert and --tls-key serve gRPC over TLS (grpcs://), --tls-client-ca with them mutual TLS;
    the banner prints the deploy line with the flags a client needs.
    """
    rep = reporter(json_out)

    def body() -> None:
        import signal
        import sys

        from .serve import Trace, TritonServer

        def stop(signum, frame):  # noqa: ANN001, ANN202
            raise KeyboardInterrupt

        load_all = load and not explicit
        if poll and not load_all:
            raise UsageError("--poll loads the whole repository: it does not go with --no-load")
        mode = "poll" if poll else "explicit"
        # SIGTERM (kill, a service manager) stops it like Ctrl-C: the server and its folder go.
        # SIGINT too, explicitly: a job a script started with `&` inherits SIGINT ignored.
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        tls = _tls(tls_cert, tls_key, tls_client_ca)
        traced = Trace.parse(trace, trace_rate, trace_level, force=force) if trace is not None else None
        if traced is None and (trace_rate != 1 or trace_level.upper() != "TIMESTAMPS"):
            raise UsageError("--trace-rate and --trace-level go with --trace")
        if traced is not None:
            _check_trace_sdk(rep)
        ports, notes = _ports(http_port, grpc_port, metrics_port)
        # the server keeps running when a model fails to load: the failures are reported below
        server = TritonServer(repository, mode=mode, load_all=load_all, http_port=ports["http"],
                              grpc_port=ports["grpc"], metrics_port=ports["metrics"],
                              extra_args=["--exit-on-error=false", "--strict-readiness=false", *tls.args()],
                              trace=traced)
        failed = True   # until started: a failed start names the log, which is then kept
        try:
            with rep.status("starting tritonserver"):
                server.start()
            failed = False   # any later failure says its own reasons: the temporary folder goes
            try:
                models = server.models()
                down = [m for m in models if m.get("state") != "READY"] if load_all else []
                if down and not allow_unavailable:
                    _unavailable(rep, down, len(models))
                # the Ctrl-C that the last line printed invites may come before _wait's loop starts
                _serving(rep, server, repository, notes, models, mode, tls)
                _wait(server)
            except KeyboardInterrupt:
                sys.stderr.write("stopping tritonserver\n")
            failed = False
        finally:
            # the temporary folder goes, unless an error names the log in it
            relay = server.relay
            server.close(keep_log=failed and server.log_path.exists() and server.proc is not None)
            if relay is not None:
                sys.stderr.write(relay.summary() + "\n")

    run(rep, debug, body)


def _check_trace_sdk(rep) -> None:  # noqa: ANN001
    """The runtime's spans need the OpenTelemetry SDK in the server's Python (the trace extra);
    without it Triton's own spans still go out, and this says so."""
    import importlib.util

    if importlib.util.find_spec("opentelemetry.sdk") is None or \
            importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
        rep.err.print("note: the OpenTelemetry SDK is not installed (pip install 'mcp-cli[trace]'): only Triton's "
                      "own spans are traced, not the runtime's", markup=False)


def _unavailable(rep, down: list[dict], total: int) -> None:  # noqa: ANN001
    from mcp_compiler.errors import ServerLoadError

    rep.json({"unavailable": down})
    for m in down:
        rep.err.print(f"model {m['name']} v{m.get('version') or '-'}: {m.get('state') or 'NOT LOADED'}: "
                      f"{m.get('reason') or 'no reason given'}", markup=False)
    raise ServerLoadError(f"{len(down)} of {total} models failed to load (listed above); "
                          "--allow-unavailable serves the others")


def _ports(http: int | None, grpc: int | None, metrics: int | None) -> tuple[dict[str, int], list[str]]:
    from .serve import port_free

    ports, notes = {}, []
    for kind, given in (("http", http), ("grpc", grpc), ("metrics", metrics)):
        if given is None:
            default = TRITON_PORTS[kind]
            given = default if port_free(default) else 0
            if not given:
                notes.append(f"port {default} ({kind}) is taken: serving {kind} on a free port")
        ports[kind] = given
    return ports, notes


class _Tls:
    """serve's gRPC TLS: the server's certificate and key, and for mutual TLS the CA its clients'
    certificates must come from (Triton's --grpc-use-ssl[-mutual]); none: plaintext."""

    def __init__(self, cert: Path | None = None, key: Path | None = None, client_ca: Path | None = None) -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca

    def __bool__(self) -> bool:
        return self.cert is not None

    def args(self) -> list[str]:
        if not self:
            return []
        out = ["--grpc-use-ssl=true", f"--grpc-server-cert={self.cert}", f"--grpc-server-key={self.key}"]
        if self.client_ca is not None:
            out += ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={self.client_ca}"]
        return out

    def client_flags(self) -> str:
        """What a client adds to its --url grpcs://...: the CA to check this server with (the
        client CA where given, one CA for both being the usual set-up; else the certificate, right
        for a self-signed one), and for mutual TLS its own certificate."""
        flags = f" --root-cert {self.client_ca or self.cert}"
        return flags + (" --client-cert CLIENT.pem --client-key CLIENT.key" if self.client_ca else "")


def _tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> _Tls:
    """Checked before the server starts: both of --tls-cert and --tls-key or neither, each a PEM
    of its kind (deploy.pem_path), --tls-client-ca only with them."""
    from .deploy import pem_path

    if (cert is None) != (key is None):
        raise UsageError("--tls-cert and --tls-key go together (the server's certificate and its private key)")
    if client_ca is not None and cert is None:
        raise UsageError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
    if cert is None:
        return _Tls()
    return _Tls(*(Path(pem_path(p, kind)).resolve() if p is not None else None
                  for p, kind in ((cert, "certificate"), (key, "key"), (client_ca, "certificate"))))


def _serving(rep, server, repository: Path, notes: list[str], models: list[dict], mode: str,  # noqa: ANN001
             tls: _Tls | None = None) -> None:
    tls = tls or _Tls()
    grpc = f"{'grpcs' if tls else 'grpc'}://{server.grpc_url}"
    rep.json({"http": f"http://{server.http_url}", "grpc": grpc,
              "metrics": f"http://{server.metrics_url}/metrics", "log": str(server.log_path),
              "model_control": mode, "notes": notes, "models": models,
              "tls": {"mutual": tls.client_ca is not None, "http": False} if tls else None,
              "trace": (server.trace.otlp or str(server.trace.file)) if server.trace else None})
    if rep.json_mode:
        rep.finish(ok=True)   # printed now: the server runs until stopped
        return
    for note in notes:
        rep.out.print(f"note: {note}", markup=False)
    secured = (" (TLS; mutual: clients need a certificate signed by the --tls-client-ca)" if tls.client_ca else
               " (TLS)") if tls else ""
    plain_http = "  (no TLS: Triton's HTTP has none; 127.0.0.1 only)" if tls else ""
    rep.out.print(f"Triton is serving {repository}\n  HTTP     http://{server.http_url}{plain_http}\n"
                  f"  gRPC     {grpc}{secured}\n  metrics  http://{server.metrics_url}/metrics  (Prometheus)\n"
                  f"  log      {server.log_path}", markup=False)
    if server.trace:
        t = server.trace
        rep.out.print(f"  traces   {t.otlp or t.file} (one request in {t.rate}, {t.level}; the runtime's spans "
                      f"{'to the same collector' if t.otlp else f'in {t.file}.runtime.jsonl'})", markup=False)
        if server.relay is not None:
            rep.out.print(f"           through a local relay: a slow or dead collector drops spans, never requests "
                          f"(counts: {server.relay.metrics_url}, and at exit)", markup=False)
    for m in models:
        rep.out.print(f"  model {_model_line(m)}", markup=False)
    if mode == "explicit":
        rep.out.print(f"Deploy more: mcp-cli deploy DIR/NAME --url {grpc}{tls.client_flags() if tls else ''}",
                      markup=False)
    rep.out.print("Ctrl-C stops it.", markup=False)


def _metrics_line(s: dict | None) -> str:
    if s is None:
        return "no metrics (not loaded, or another server's metrics port: --metrics-url)"

    def ms(v):  # noqa: ANN001, ANN202
        return "-" if v is None else f"{v:.2f} ms"

    parts = [f"{s['success']} ok, {s['failure']} failed",
             f"avg batch {s['avg_batch']}" if s["avg_batch"] is not None else "no executions",
             f"avg request {ms(s['avg_request_ms'])} (queue {ms(s['avg_queue_ms'])}, infer {ms(s['avg_infer_ms'])})"]
    if s.get("load_s"):
        ld = s["load_s"]
        parts.append("load " + ", ".join(f"{k} {ld[k]:.3f} s" for k in ("total", "import", "read", "session") if k in ld))
    if s.get("runtime_errors") is not None:
        parts.append(f"runtime errors {int(s['runtime_errors'])}")
    if s.get("spans_dropped") is not None:
        parts.append(f"spans dropped {int(s['spans_dropped'])}")
    return "; ".join(parts)


def _model_line(m: dict) -> str:
    version = f" v{m['version']}" if m.get("version") else ""
    reason = f" ({m['reason']})" if m.get("reason") else ""
    return f"{m['name']}{version}: {m.get('state') or 'NOT LOADED'}{reason}"


def _wait(server) -> None:  # noqa: ANN001 - serve.TritonServer
    """Until Ctrl-C or SIGTERM (KeyboardInterrupt); the server exiting by itself raises."""
    import time

    while server.proc.poll() is None:
        time.sleep(0.5)
    raise ServerError(f"tritonserver exited with code {server.proc.returncode} (log: {server.log_path})")


@command("verify", "mcp-cli verify model.onnx model_repository/model",
         "mcp-cli verify model.onnx repo/model --samples 4 --dims batch=2 --json")
def verify(
    model: Optional[Path] = typer.Argument(None, help="The original ONNX model.", show_default=False),
    entry: Optional[Path] = typer.Argument(None, help="The emitted entry: DIR/NAME.", show_default=False),
    input: Optional[Path] = typer.Option(None, "--input", "-i", hidden=True, dir_okay=False,
                                         help="The original model, the older way."),
    repository: Optional[Path] = typer.Option(None, "--repository", "-r", hidden=True,
                                              help="The entry, the older way."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, max=10_000, help="Random input sets to compare "
                                          "(default 1; 16 for a quantized entry; at most 10,000)."),
    budget: Optional[str] = typer.Option(None, "--accuracy-budget", metavar="cos=0.99[,max-abs=X,rel=Y]",
                                         help="Judge a quantized entry by this (default: its level's: cos 0.999 "
                                              "fp16/bf16, 0.99 fp8, 0.98 int4) instead of --rtol/--atol."),
    dims: Optional[str] = typer.Option(None, "--dims", metavar="NAME=SIZE[,...]", help="Symbol sizes, e.g. "
                                       "batch=2,H=64 (default: sizes the model's ops accept, found from its shapes)."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="Compare on your own inputs: an .npz "
                                          "(arrays named like the inputs) or a folder of them."),
    rtol: float = typer.Option(1e-3, "--rtol", help="Relative tolerance (>= 0)."),
    atol: float = typer.Option(1e-4, "--atol", help="Absolute tolerance (>= 0)."),
    timeout_s: float = typer.Option(600.0, "--timeout", min=1, help="Give up after this many seconds (exit 1): "
                                    "a model can run for ever (a Loop of 2^62 trips)."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Run the original in onnxruntime and the emitted entry through its serving runtime; compare."""
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler.cli.common import watchdog

        from .verify import verify as run_verify

        for flag, v in (("--rtol", rtol), ("--atol", atol)):
            if not 0 <= v < float("inf"):
                raise UsageError(f"{flag} must be a finite number >= 0, got {v}")
        where = entry if entry is not None else repository
        if model is not None and model.is_dir():
            # the entry alone (`mcp-cli verify repo/name`): the original is what it is compared with
            raise UsageError(f"{model} is a folder; verify compares an entry with its original model, the .onnx "
                             f"first: `mcp-cli verify MODEL.onnx {where if where is not None else model}`")
        original = one_model(model, input, "MODEL", "the original .onnx model, then the entry (e.g. `mcp-cli verify "
                             "model.onnx model_repository/model`)")
        if where is None:
            raise UsageError("missing ENTRY: the emitted DIR/NAME to compare (e.g. `mcp-cli verify "
                             "model.onnx model_repository/model`)")
        from mcp_compiler.accuracy import parse_budget

        judge = parse_budget(budget)
        if "top1" in judge:
            raise UsageError("--accuracy-budget: verify judges cos, max-abs and rel (top1 is the conversion's report)")
        with watchdog(rep, timeout_s, "verify"):
            r = run_verify(original, where, samples=samples, dims=parse_dims(dims), rtol=rtol, atol=atol,
                           inputs=inputs, budget=judge or None)
        rep.verified(r)
        r.raise_if_failed()

    run(rep, debug, body)


@dataclass
class ConnectionFlags:
    """The connection options every command that talks to a running Triton shares (one group,
    declared once: `with_connection`), and the Connection they make."""

    url: Optional[str] = None
    protocol: Optional[str] = None
    ssl: bool = False
    root_cert: Optional[Path] = None
    client_cert: Optional[Path] = None
    client_key: Optional[Path] = None
    token: Optional[str] = None
    token_header: str = "mcp-api-key"
    timeout: float = 60.0
    grpc_only: bool = False

    def connection(self, required: bool = True):  # noqa: ANN201 - deploy.Connection, or None
        """The Connection, checked; None when no --url was given and none is `required`."""
        import os

        from .deploy import Connection, parse_url

        if self.url is None:
            if required:
                raise UsageError("missing --url: the Triton server (grpc://HOST:PORT or http://HOST:PORT, as "
                                 "`serve` prints them)")
            if self.ssl or self.root_cert or self.client_cert or self.token:
                raise UsageError("--ssl/--root-cert/--client-cert/--token need --url (a running server)")
            return None
        if (self.client_cert is None) != (self.client_key is None):
            raise UsageError("--client-cert and --client-key go together")
        hostport, proto, ssl = parse_url(self.url, self.protocol, self.ssl)
        if (self.root_cert or self.client_cert) and not ssl:
            raise UsageError("--root-cert/--client-cert need --ssl (or an https:// / grpcs:// --url)")
        if self.grpc_only and proto != "grpc":
            raise UsageError(f"--url {self.url}: bench measures over gRPC; give the server's gRPC port "
                             "(the grpc:// address `serve` prints)")
        token = self.token or os.environ.get("MCP_API_KEY") or None
        _header_fits("--token-header", self.token_header, _HEADER_NAME)
        if token is not None:   # never echoed: it is a secret
            _header_fits("--token (or $MCP_API_KEY)", token, _HEADER_VALUE, show=False)
        return Connection(hostport, proto, ssl, self.root_cert, self.client_cert, self.client_key,
                          token, self.token_header, self.timeout)


_HEADER_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")   # an HTTP token, lower case (gRPC metadata keys)
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")   # printable ASCII, no edge spaces


def _header_fits(flag: str, value: str, pattern: re.Pattern, *, show: bool = True) -> None:
    """What goes into a request header is checked before anything is sent (gRPC refuses a bad
    key or value in its own log lines, after the connection)."""
    if not pattern.fullmatch(value):
        what = f" {value!r}" if show else ""
        raise UsageError(f"{flag}{what} cannot be sent as an HTTP/gRPC header "
                         f"({'letters, digits and -_.!#$%&*+^`|~, lower case' if pattern is _HEADER_NAME else 'printable ASCII'})")


def with_connection(url_help: str = "The Triton server: grpc://HOST:PORT, http://HOST:PORT (as `serve` prints "
                                    "them), or HOST:PORT with --protocol.", *,
                    grpc_only: bool = False) -> Callable[[Callable], Callable]:
    """Declare the connection group on a command: its `conn: ConnectionFlags` parameter becomes
    --url, --protocol (not for gRPC-only commands), --ssl, --root-cert, --client-cert,
    --client-key, --token, --token-header and --timeout, in the "Connection" help panel."""
    import functools
    import inspect

    P = inspect.Parameter
    panel = "Connection"

    def opt(name: str, default, annotation, *decls: str, help: str, **kw) -> inspect.Parameter:  # noqa: ANN001
        return P(name, P.KEYWORD_ONLY, annotation=annotation,
                 default=typer.Option(default, *decls, help=help, rich_help_panel=panel, **kw))

    group = [opt("url", None, Optional[str], "--url", help=url_help)]
    if not grpc_only:
        group.append(opt("protocol", None, Optional[Protocol], "--protocol", case_sensitive=False,
                         help="grpc or http, for a --url without a scheme (default grpc)."))
    group += [
        opt("ssl", False, bool, "--ssl", help="TLS (gRPC; Triton's HTTP endpoint has no TLS of its own)."),
        opt("root_cert", None, Optional[Path], "--root-cert", help="CA certificate to check the server with."),
        opt("client_cert", None, Optional[Path], "--client-cert", help="Client certificate, for mutual TLS."),
        opt("client_key", None, Optional[Path], "--client-key", help="Client private key, for mutual TLS."),
        opt("token", None, Optional[str], "--token", help="Auth token sent as a header (default: $MCP_API_KEY). "
            "Never printed."),
        opt("token_header", "mcp-api-key", str, "--token-header", help="Header that carries the token (the key of "
            "the server's --grpc-restricted-protocol / --http-restricted-api setting)."),
        opt("timeout", 60.0, float, "--timeout", help="Network timeout, seconds."),
    ]
    names = [g.name for g in group]

    def decorate(fn: Callable) -> Callable:
        sig = inspect.signature(fn, eval_str=True)
        params = []
        for p in sig.parameters.values():
            params.extend(group if p.name == "conn" else [p.replace(kind=P.KEYWORD_ONLY)])

        @functools.wraps(fn)
        def wrapper(**kw):  # noqa: ANN202
            given = {n: kw.pop(n) for n in names}
            if given.get("protocol") is not None:
                given["protocol"] = str(given["protocol"])
            return fn(conn=ConnectionFlags(**given, grpc_only=grpc_only), **kw)

        wrapper.__signature__ = sig.replace(parameters=params)
        return wrapper
    return decorate


@command("deploy", "mcp-cli deploy repo/model --url grpc://127.0.0.1:8001",
         "mcp-cli deploy repo/model --url http://127.0.0.1:8000 --model-version 2",
         ("mcp-cli deploy repo/model --url triton:8001 --ssl --root-cert ca.pem",
          "  --rollback-on-failure"),
         "mcp-cli deploy repo/model --url 127.0.0.1:8001 --dry-run --json",
         ("mcp-cli deploy repo/model --kserve --storage-uri s3://bucket/repo",
          "  --image registry/mcp-triton:24.10 --min-replicas 1 --max-replicas 4",
          "  -o manifests/"),
         ("mcp-cli deploy repo/model --kserve --storage-uri s3://bucket/repo",
          "  --from-tune tune.json --canary-percent 10 -o manifests/"),
         "mcp-cli deploy repo/model --kserve --dockerfile > Dockerfile")
@with_connection()
def deploy(
    entry: Path = typer.Argument(..., help="The repository entry to push: DIR/NAME."),
    conn: ConnectionFlags = None,   # the connection group: with_connection
    model_version: Optional[int] = typer.Option(None, "--model-version", help="Version number on the server "
                                                "(default: the entry's newest version folder)."),
    version: Optional[int] = typer.Option(None, "--version", hidden=True, help="Same as --model-version."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name on the server (default: the config's)."),
    wait_timeout: float = typer.Option(120.0, "--wait-timeout", help="Seconds to wait for READY."),
    smoke: bool = typer.Option(True, "--smoke/--no-smoke", help="Run one inference after loading."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="The smoke request: the first sample of "
                                          "this .npz (or folder of them), arrays named like the inputs "
                                          "(default: inputs the model accepts, found from its shapes)."),
    dims: Optional[str] = typer.Option(None, "--dims", metavar="NAME=SIZE[,...]",
                                       help="Symbol sizes for the smoke request (default: sizes the model accepts)."),
    rollback: bool = typer.Option(False, "--rollback-on-failure",
                                  help="If the smoke inference fails, load the last good deploy again."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the entry, print what would be sent, send nothing."),
    force: bool = typer.Option(False, "--force", help="Replace the same version serving other files."),
    kserve: bool = typer.Option(False, "--kserve", rich_help_panel="Kubernetes (KServe)",
                                help="Write Kubernetes manifests instead of pushing to one server: a KServe "
                                "InferenceService, and a plain Deployment + Service + HPA (plain/)."),
    output: str = typer.Option("manifests", "-o", "--output", rich_help_panel="Kubernetes (KServe)",
                               help="Folder for the manifests (existing ones are replaced only with --force)."),
    storage_uri: Optional[str] = typer.Option(None, "--storage-uri", rich_help_panel="Kubernetes (KServe)",
                                              help="Where the model repository (DIR) is uploaded: s3://, gs://, pvc://."),
    min_replicas: int = typer.Option(1, "--min-replicas", rich_help_panel="Kubernetes (KServe)",
                                     help="Replicas at the least (0: KServe scales to zero when idle)."),
    max_replicas: int = typer.Option(4, "--max-replicas", rich_help_panel="Kubernetes (KServe)",
                                     help="Replicas at the most."),
    canary_percent: Optional[int] = typer.Option(None, "--canary-percent", rich_help_panel="Kubernetes (KServe)",
                                                 help="An update of a running InferenceService that routes this % "
                                                 "to the new revision."),
    promote: bool = typer.Option(False, "--promote", rich_help_panel="Kubernetes (KServe)",
                                 help="An update that routes all traffic to the latest revision."),
    namespace: str = typer.Option("default", "--namespace", rich_help_panel="Kubernetes (KServe)",
                                  help="The Kubernetes namespace of the objects."),
    from_tune: Optional[Path] = typer.Option(None, "--from-tune", rich_help_panel="Kubernetes (KServe)",
                                             help="A `tune --json` report: autoscale on the concurrency its best "
                                             "configuration held within the SLO (default: CPU at 70%)."),
    image: Optional[str] = typer.Option(None, "--image", rich_help_panel="Kubernetes (KServe)",
                                        help="The server image (a python-backend entry needs onnxruntime in it: "
                                        "see --dockerfile)."),
    service_name: Optional[str] = typer.Option(None, "--service-name", rich_help_panel="Kubernetes (KServe)",
                                               help="The Kubernetes name (default: from the model's name)."),
    canary_steps: Optional[str] = typer.Option(None, "--canary-steps", metavar="P[,P...]",
                                               rich_help_panel="Kubernetes (KServe)",
                                               help="Also an Argo Rollouts canary of the plain Deployment "
                                               "(rollout/): traffic % per step, ending at 100, e.g. 10,30,100."),
    max_p99_ms: Optional[float] = typer.Option(None, "--max-p99-ms", rich_help_panel="Kubernetes (KServe)",
                                               help="With --canary-steps: the rollout is aborted when a pod's p99 "
                                               "(Triton's metrics in Prometheus) passes this."),
    prometheus_url: str = typer.Option("http://prometheus-operated.monitoring.svc:9090", "--prometheus-url",
                                       rich_help_panel="Kubernetes (KServe)",
                                       help="The Prometheus the rollout's analysis queries."),
    step_pause: str = typer.Option("5m", "--step-pause", rich_help_panel="Kubernetes (KServe)",
                                   help="The pause after each canary step but the last (30s, 5m, 1h)."),
    service_account: Optional[str] = typer.Option(None, "--service-account", rich_help_panel="Kubernetes (KServe)",
                                                  help="The pods' service account: the one your storage "
                                                  "credentials (an S3 or GCS secret) are attached to."),
    apply: bool = typer.Option(False, "--apply", rich_help_panel="Kubernetes (KServe)",
                               help="Also create or update them through the Kubernetes API (the kubeconfig's cluster)."),
    plain: bool = typer.Option(False, "--plain", rich_help_panel="Kubernetes (KServe)",
                               help="With --apply: apply the Deployment + Service + HPA, not the InferenceService."),
    kubeconfig: Optional[str] = typer.Option(None, "--kubeconfig", rich_help_panel="Kubernetes (KServe)",
                                             help="Default: $KUBECONFIG or ~/.kube/config."),
    dockerfile: bool = typer.Option(False, "--dockerfile", rich_help_panel="Kubernetes (KServe)",
                                    help="Print the Dockerfile of a server image for python-backend entries; write nothing."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Upload a model to a running Triton (model repository extension), wait for READY, smoke-test it;
    or, with --kserve, write the Kubernetes manifests that serve it on a cluster.

    The server must accept loads: `mcp-cli serve` does by default (not with --poll). Each
    successful deploy is kept for --rollback-on-failure under $MCP_STATE_DIR (default
    ~/.local/state/mcp-cli/deployments; at most $MCP_STATE_KEEP of them, default 8; `undeploy`
    removes it). The same version serving other files needs --force.

    --kserve validates every manifest before writing any (Kubernetes' schemas, the KServe SDK's
    types; `pip install 'mcp-cli\\[kube]'`), and prints the `kubectl apply -f` line.
    """
    rep = reporter(json_out)

    def body() -> None:
        from .deploy import deploy as run_deploy

        if version is not None and model_version is not None and version != model_version:
            raise UsageError("give the version once: --model-version")
        if kserve or dockerfile:
            if conn.url is not None:
                raise UsageError("--kserve writes manifests for a cluster; --url pushes to one server: give one")
            return _kserve(rep, entry, json_out, dockerfile, output, force, apply, plain, kubeconfig, conn.timeout,
                           dict(storage_uri=storage_uri, namespace=namespace, name=service_name,
                                min_replicas=min_replicas, max_replicas=max_replicas, canary_percent=canary_percent,
                                promote=promote, tune_report=from_tune, image=image, service_account=service_account,
                                canary_steps=_percent_list(canary_steps), max_p99_ms=max_p99_ms,
                                prometheus_url=prometheus_url, step_pause=step_pause,
                                model_version=model_version if model_version is not None else version))
        k8s_only = [f for f, v in (("--storage-uri", storage_uri), ("--canary-percent", canary_percent),
                                   ("--from-tune", from_tune), ("--image", image), ("--apply", apply),
                                   ("--promote", promote), ("--service-account", service_account),
                                   ("--canary-steps", canary_steps), ("--max-p99-ms", max_p99_ms)) if v]
        if k8s_only:
            raise UsageError(f"{k8s_only[0]} goes with --kserve")
        if conn.url is None:
            raise UsageError("missing --url: the Triton server to push to (or --kserve for Kubernetes manifests)")
        c = conn.connection()
        with rep.status(f"deploying {entry} to {c.describe()}"):
            r = run_deploy(entry, c, name=name, version=model_version if model_version is not None else version,
                           wait_timeout=wait_timeout, dry_run=dry_run, smoke=smoke, rollback_on_failure=rollback,
                           inputs=inputs, force=force, dims=parse_dims(dims))
        rep.json(r.to_dict())
        if not json_out:
            _deployed(rep, r, c)

    run(rep, debug, body)


def _percent_list(text: str | None) -> list[int] | None:
    """--canary-steps: comma-separated whole percentages (ASCII digits)."""
    if text is None:
        return None
    parts = [t.strip() for t in text.split(",")]
    if not all(t.isascii() and t.isdigit() and len(t) <= 3 for t in parts):
        raise UsageError(f"--canary-steps {text!r}: give whole percentages separated by commas, e.g. 10,30,100")
    return [int(t) for t in parts]


def _kserve(rep, entry: Path, json_out: bool, dockerfile: bool, output: str, force: bool, apply: bool,  # noqa: ANN001
            plain: bool, kubeconfig: Optional[str], timeout: float, request: dict) -> None:
    from . import kserve as ks

    if dockerfile:
        rep.out.print(ks.dockerfile_text(ks.entry_opset(entry)).rstrip("\n"), markup=False)
        return
    if plain and not apply:
        raise UsageError("--plain picks what --apply applies; both are written without it")
    if request["storage_uri"] is None:
        raise UsageError("--kserve needs --storage-uri: where the model repository (the folder holding "
                         f"{Path(entry).name}/) is uploaded, e.g. s3://bucket/model_repository")
    if not output.strip():
        raise UsageError("-o/--output: give a folder for the manifests (an empty name would write into the "
                         "current folder)")
    output = Path(output)
    if apply and kubeconfig is not None:   # a FIFO or a device would block the client for ever
        from mcp_compiler.files import read_regular

        read_regular(kubeconfig, "--kubeconfig", limit=4 << 20)
    with rep.status(f"writing and validating the manifests of {entry}"):
        m = ks.build(entry, ks.KServeRequest(**request))
        ks.check_output_folder(m, output, force)
        written = ks.write(m, output)
        applied = ks.apply(m, plain=plain, kubeconfig=kubeconfig, timeout=timeout) if apply else []
    rep.json({**m.to_dict(), "written": [str(p) for p in written], "applied": applied})
    if json_out:
        return
    s = m.scaling
    res = m.resources["resources"]
    rep.out.print(f"{m.service_name}: InferenceService (KServe, Triton {ks.TRITON_RUNTIME_VERSION}) and a plain "
                  f"Deployment + Service + HPA for {m.model_name}", markup=False)
    rep.out.print(f"  replicas {request['min_replicas']}..{request['max_replicas']}, autoscaling on {s['metric']} "
                  f"at {s['target']}{'%' if s['metric'] == 'cpu' else ' in flight per replica'} ({s['source']})",
                  markup=False)
    rep.out.print(f"  per replica: cpu {res['requests']['cpu']}, memory {res['requests']['memory']} "
                  f"(limit {res['limits']['memory']}){', 1 GPU' if m.resources['gpu'] else ''}; weights "
                  f"{m.resources['weights_bytes'] / 2**20:.1f} MiB x {m.resources['instances']} instance(s)",
                  markup=False)
    for p in written:
        rep.out.print(f"  wrote {p}", markup=False)
    for note in m.notes:
        rep.out.print(f"  note: {note}", markup=False)
    for line in applied:
        rep.out.print(f"  applied {line}", markup=False)
    if not applied:
        rep.out.print(f"next: upload {Path(entry).parent}/ to {request['storage_uri']}, then "
                      f"kubectl apply -f {output / 'inferenceservice.yaml'}   (without KServe: kubectl apply -f "
                      f"{output / 'plain' / 'triton.yaml'})", markup=False)


def _deployed(rep, r, conn) -> None:  # noqa: ANN001
    if r.dry_run:
        hdr = f", header {conn.token_header}: ***" if conn.token else ""
        rep.out.print(f"dry run: would load {r.name} v{r.version} on {r.url} ({r.upload_bytes} bytes{hdr}):",
                      markup=False)
        for f in r.files:
            rep.out.print(f"  {f}", markup=False)
        return
    prev = f" (replacing v{', v'.join(map(str, r.previous_versions))})" if r.previous_versions else ""
    smoke_txt = f", smoke inference {r.smoke_seconds * 1e3:.1f} ms" if r.smoke_seconds is not None else ""
    if r.unchanged:
        rep.out.print(f"{r.name} v{r.version} on {r.url} already serves these files (sha256 {r.content_sha256[:12]}): "
                      f"not reloaded{smoke_txt}", markup=False)
    else:
        rep.out.print(f"deployed {r.name} v{r.version} to {r.url}{prev}: READY in {r.load_seconds:.2f} s"
                      f"{smoke_txt}, {r.upload_bytes / 2**20:.1f} MiB uploaded", markup=False)
    if r.rollback_copy:
        rep.out.print(f"kept for --rollback-on-failure: {r.rollback_copy} ({r.rollback_bytes / 2**20:.1f} MiB; "
                      f"`mcp-cli undeploy {r.name}` removes it)", markup=False)
    for note in r.notes:
        rep.err.print(f"warning: {note}", markup=False)


@command("status", "mcp-cli status --url grpc://127.0.0.1:8001", "mcp-cli status --url http://127.0.0.1:8000 --json",
         ("mcp-cli status --url grpc://127.0.0.1:8001 --metrics",
          "  --metrics-url http://127.0.0.1:8002"))
@with_connection()
def server_status(
    conn: ConnectionFlags = None,
    metrics: bool = typer.Option(False, "--metrics", help="Also each model's main metrics (requests, average "
                                 "batch and latencies, the runtime's load seconds, runtime errors, dropped spans)."),
    metrics_url: Optional[str] = typer.Option(None, "--metrics-url", help="Triton's metrics endpoint (default: "
                                              "the --url's host, port 8002)."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """List the models and versions a Triton server has, their state (READY, LOADING, UNLOADING,
    UNAVAILABLE, NOT LOADED) and the server's reason; with --metrics, their main metrics from the
    server's Prometheus endpoint."""
    rep = reporter(json_out)

    def body() -> None:
        from .deploy import status as run_status

        if metrics_url is not None and not metrics:
            raise UsageError("--metrics-url goes with --metrics")
        if metrics_url is not None:
            from .metrics import metrics_url as checked_url

            checked_url(metrics_url)   # before the server is asked anything
        c = conn.connection()
        rows = run_status(c)
        if metrics:
            from .metrics import by_model, scrape, summary

            url = metrics_url or f"http://{c.url.rpartition(':')[0]}:{TRITON_PORTS['metrics']}"
            seen = by_model(scrape(url, timeout=c.timeout))
            for m in rows:
                got = seen.get((m["name"], str(m.get("version") or "")))
                m["metrics"] = summary(got) if got is not None else None
        rep.json({"models": rows})
        if json_out:
            return
        if not rows:
            rep.out.print("no models", markup=False)
        for m in rows:
            rep.out.print(_model_line(m), markup=False)
            if metrics:
                rep.out.print(f"    {_metrics_line(m.get('metrics'))}", markup=False)

    run(rep, debug, body)


@command("undeploy", "mcp-cli undeploy mymodel --url grpc://127.0.0.1:8001")
@with_connection()
def undeploy(
    name: str = typer.Argument(..., help="The model to unload."),
    conn: ConnectionFlags = None,
    wait_timeout: float = typer.Option(60.0, "--wait-timeout", help="Seconds to wait for the unload to finish."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Unload a model from a running Triton, wait until the server has let it go, and remove
    the copy deploy kept of it for rollback."""
    rep = reporter(json_out)

    def body() -> None:
        from .deploy import undeploy as run_undeploy

        r = run_undeploy(name, conn.connection(), wait_timeout=wait_timeout)
        rep.json({"name": name, "unloaded": True, **r})
        if not json_out:
            now = "the server no longer lists it" if r["state"] == "UNLOADED" else f"now {r['state']}"
            rep.out.print(f"unloaded {name} in {r['seconds']:.2f} s ({now})", markup=False)
            if r["forgot"]:
                rep.out.print(f"removed its rollback copy {r['forgot']}", markup=False)

    run(rep, debug, body)


def _numbers(text: str | None, flag: str, kind: type) -> list:
    if text is None:
        return []
    out = []
    for piece in text.split(","):
        try:
            v = kind(piece.strip()) if piece.strip().isascii() else None   # int() takes '٣' as 3
        except ValueError:
            v = None
        if v is None or v <= 0 or (kind is float and v != v) or v > 1e6:
            raise UsageError(f"{flag}: expected positive numbers separated by commas, got {piece.strip()!r}")
        out.append(v)
    return out


def _loads(concurrency: str | None, rate: str | None, default: str | None = "1,8,32") -> list:
    from .loadgen import Load

    loads = [Load(concurrency=c) for c in _numbers(concurrency, "--concurrency", int)]
    loads += [Load(rate=r) for r in _numbers(rate, "--rate", float)]
    if not loads and default:
        loads = [Load(concurrency=c) for c in _numbers(default, "--concurrency", int)]
    return loads


def _cold(rep, target: str, remote, runs: int, metrics_url: Optional[str], inputs, dims, json_out: bool) -> None:  # noqa: ANN001
    from .bench import served
    from .cold import cold

    say = _progress(rep)
    with served(target, remote, inputs=inputs, dims=parse_dims(dims)) as s:
        url = metrics_url or (f"http://{s.server.metrics_url}/metrics" if s.server is not None else None)
        r = cold(s, runs, url, progress=lambda k, run: say(
            f"cold start {k + 1} of {runs}: READY in {run.load_s:.2f} s, first request {run.first_ms:.1f} ms"))
    rep.json({"cold": r.to_dict()})
    if json_out:
        return
    rep.out.print(f"cold start of {r.model} on {r.url} ({len(r.runs)} runs; load: the load request until READY)",
                  markup=False)
    head = (f"{'run':<5}{'load s':>8}{'import s':>9}{'read s':>8}{'session s':>10}{'other s':>9}{'first ms':>10}"
            f"{'server ms q/in/infer/out':>28}{'warm-up ms':>12}{'p50 ms':>9}{'p99 ms':>9}")
    rep.out.print(head, markup=False)

    def f(v, fmt: str) -> str:  # noqa: ANN001
        return "-" if v is None else format(v, fmt)

    for k, c in enumerate(r.runs, 1):
        rt = c.runtime_s or {}
        sv = c.server_ms
        split = f"{sv['queue']:.1f}/{sv['input']:.1f}/{sv['infer']:.1f}/{sv['output']:.1f}"
        rep.out.print(f"{k:<5}{c.load_s:>8.3f}{f(rt.get('import'), '.3f'):>9}{f(rt.get('read'), '.3f'):>8}"
                      f"{f(rt.get('session'), '.3f'):>10}{f(c.other_s, '.3f'):>9}{c.first_ms:>10.2f}{split:>28}"
                      f"{c.warmup_ms:>12.2f}{c.steady_p50_ms:>9.2f}{c.steady_p99_ms:>9.2f}", markup=False)
    med = r.to_dict()["median"]
    rep.out.print(f"median: load {med['load_s']:.3f} s, first request {med['first_ms']:.2f} ms "
                  f"(warm-up {med['warmup_ms']:.2f} ms over the steady p50 {med['steady_p50_ms']:.2f} ms)", markup=False)
    for note in r.notes:
        rep.out.print(f"note: {note}", markup=False)


def _progress(rep):  # noqa: ANN001, ANN202
    def say(line: str) -> None:
        if not rep.json_mode:
            rep.err.print(line, markup=False)
    return say


@command("bench", "mcp-cli bench model_repository/model",
         "mcp-cli bench repo/model --concurrency 1,8,32 --batch-size 4 --json",
         "mcp-cli bench repo/model --rate 200,800 --seconds 10 --csv points.csv",
         "mcp-cli bench mymodel --url grpc://127.0.0.1:8001 --concurrency 16")
@with_connection("A running Triton's gRPC address, grpc://HOST:PORT or HOST:PORT (default: start a local one "
                 "for DIR/NAME).", grpc_only=True)
def bench(
    target: str = typer.Argument(..., help="DIR/NAME: a repository entry (a local Triton is started for it); "
                                 "or NAME with --url: a model a running server has.", show_default=False),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c", metavar="N[,N...]",
                                              help="Closed loop: N clients, each sending when its last "
                                                   "request returns (default: 1,8,32)."),
    rate: Optional[str] = typer.Option(None, "--rate", metavar="R[,R...]",
                                       help="Open loop: Poisson arrivals at R requests/s."),
    batch_size: int = typer.Option(1, "--batch-size", "-b", min=1, help="Rows per request (batching models)."),
    seconds: Optional[float] = typer.Option(None, "--seconds", min=0.1, help="Measure each point for this long "
                                            "(default: 2 s windows until three agree within 10%)."),
    window_s: float = typer.Option(2.0, "--window-s", min=0.1, help="Measurement window, seconds."),
    max_windows: int = typer.Option(10, "--max-windows", min=3, help="Windows before giving up on stability."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="The request: the first sample of this .npz "
                                          "(or folder of them), arrays named like the inputs."),
    dims: Optional[str] = typer.Option(None, "--dims", metavar="NAME=SIZE[,...]",
                                       help="Request sizes: the model's symbols (DIR/NAME), or INPUT.AXIS / '*' "
                                            "for a remote model's -1 dims (default: free dims at 128)."),
    slo_p99_ms: Optional[float] = typer.Option(None, "--slo-p99-ms", help="Also report each point's SLO "
                                               "attainment: the fraction of requests within this latency."),
    sequence_length: Optional[int] = typer.Option(None, "--sequence-length", min=1, max=1_000_000,
                                                  help="A stateful model: each client streams sequences of N "
                                                       "requests (one correlation ID each; default 1)."),
    cold_start: bool = typer.Option(False, "--cold", help="Measure cold starts instead: N times unload, load "
                                    "(to READY), first request, steady state; with the runtime's load phases."),
    cold_runs: int = typer.Option(3, "--cold-runs", min=1, max=100, help="--cold: how many cold starts."),
    metrics_url: Optional[str] = typer.Option(None, "--metrics-url", help="--cold with --url: the server's "
                                              "metrics endpoint (http://HOST:8002), for the runtime's load phases."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", dir_okay=False, help="Also write the points as CSV."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --csv file."),
    conn: ConnectionFlags = None, json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Measure a served model under load: throughput, p50/p90/p99 latency, errors, and the server's
    own split (queue vs compute, average batch) from Triton's statistics, per load point.

    The request is what the model accepts, as verify makes it, with free dims (a sequence length,
    an image side) at 128 unless --dims says otherwise; its shapes are printed first. An open-loop
    point that serves under 95% of the requests it issued (or issues short of the rate beyond
    Poisson noise), or whose p99 passes the queue timeout, is marked saturated. The client
    is tritonclient's asyncio gRPC client in this process; its CPU use is reported, so a saturated
    client shows. Exit 1 when the server cannot be reached or lacks the statistics extension; exit
    2 for bad flags.
    """
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler.files import check_output

        from .bench import bench as run_bench

        if metrics_url is not None:
            from .metrics import metrics_url as checked_url

            checked_url(metrics_url)
        if cold_start:
            ignored = [f for f, v in (("--concurrency", concurrency), ("--rate", rate), ("--csv", csv_path),
                                      ("--seconds", seconds), ("--slo-p99-ms", slo_p99_ms),
                                      ("--sequence-length", sequence_length)) if v is not None]
            if ignored:
                raise UsageError(f"{ignored[0]} does not go with --cold (a cold start is measured with "
                                 "sequential requests; --cold-runs sets how many)")
            return _cold(rep, target, conn.connection(required=False), cold_runs, metrics_url, inputs, dims, json_out)
        if metrics_url is not None:
            raise UsageError("--metrics-url goes with --cold")
        loads = _loads(concurrency, rate)
        if csv_path is not None:
            check_output(csv_path, "--csv", force=force)
        remote = conn.connection(required=False)
        if slo_p99_ms is not None and not 0 < slo_p99_ms < float("inf"):
            raise UsageError(f"--slo-p99-ms must be a positive number, got {slo_p99_ms}")
        say = _progress(rep)

        def shown(shapes: dict, notes: list[str]) -> None:
            say(f"request: {_shapes_text(shapes)}")

        r = run_bench(target, loads, remote, batch_size=batch_size, window_s=window_s, max_windows=max_windows,
                      seconds=seconds, inputs=inputs, dims=parse_dims(dims), slo_ms=slo_p99_ms, on_inputs=shown,
                      sequence_length=sequence_length,
                      progress=lambda k, n, load: say(f"point {k + 1} of {n}: {load.label}"),
                      window_progress=lambda k, rate, p99: say(
                          f"  window {k}: {rate:.1f} req/s, p99 {'-' if p99 is None else f'{p99:.2f}'} ms"))
        if csv_path is not None:
            _write_csv(csv_path, [p.to_dict() for p in r.points])
        rep.json(r.to_dict())
        if not json_out:
            _bench_table(rep, r)
        if r.points and all(p.throughput == 0 and p.errors > 0 for p in r.points):
            from .bench import BenchFailedError

            sample = next((p.error_sample for p in r.points if p.error_sample), None)
            raise BenchFailedError(f"every request failed at every load point ({sum(p.errors for p in r.points)} "
                                   f"errors){f': {sample}' if sample else ''}")
        empty = [p for p in r.points if p.requests == 0 and p.errors == 0]
        if empty:   # nothing completed and nothing failed: a request outlasts the windows
            from .bench import BenchFailedError

            p = empty[0]
            raise BenchFailedError(f"load point {p.load} completed no request in {p.seconds:.1f} s (none failed "
                                   "either: one request takes longer than the measurement); give --seconds or "
                                   "--window-s longer than a request takes")

    run(rep, debug, body)


def _write_csv(path: Path, rows: list[dict]) -> None:
    import csv
    import io
    import os

    buf = io.StringIO()
    keys = [k for k in rows[0] if k != "notes"] if rows else []
    w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(buf.getvalue(), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _shapes_text(shapes: dict[str, dict]) -> str:
    """bench.shapes_of() as a line: `input_ids int64[1, 128], mask int64[1, 128]`."""
    return ", ".join(f"{k} {v['dtype']}[{', '.join(map(str, v['shape']))}]" for k, v in shapes.items())


def _bench_table(rep, r) -> None:  # noqa: ANN001 - bench.BenchReport
    def f(v, fmt: str = "{:.2f}") -> str:  # noqa: ANN001
        return "-" if v is None else fmt.format(v)

    rep.out.print(f"{r.model} on {r.url}, batch {r.batch_size}; request {_shapes_text(r.inputs)}", markup=False)
    slo = any(p.slo_attainment is not None for p in r.points)
    head = f"{'load':<18}{'req/s':>10}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'errors':>8}{'queue ms':>10}" \
           f"{'compute ms':>12}{'batch':>7}{'client cpu':>12}{'stable':>8}{'saturated':>11}" + (f"{'in SLO':>8}" if slo else "")
    rep.out.print(head, markup=False)
    for p in r.points:
        stable = "yes" if p.stable else (f"no cv {p.cv:.0%}" if p.cv is not None else "no") if p.stable is False else "-"
        rep.out.print(f"{p.load:<18}{p.throughput:>10.1f}{f(p.p50_ms):>9}{f(p.p90_ms):>9}{f(p.p99_ms):>9}"
                      f"{p.errors:>8}{f(p.queue_ms):>10}{f(p.compute_ms):>12}{f(p.avg_batch):>7}"
                      f"{p.client_cpu:>11.0%} {stable:>7}{('YES' if p.saturated else 'no'):>11}"
                      + (f"{f(p.slo_attainment, '{:.1%}'):>8}" if slo else ""), markup=False)
        if p.error_sample:
            rep.out.print(f"  first error: {p.error_sample}", markup=False)
        for note in p.notes:
            rep.out.print(f"  note: {note}", markup=False)
    for note in r.notes:
        rep.out.print(f"note: {note}", markup=False)


class Objective(Choice):
    throughput = "throughput"
    latency = "latency"


@command("tune", "mcp-cli tune repo/model --slo-p99-ms 20 --concurrency 16",
         ("mcp-cli tune repo/model --slo-p99-ms 5 --rate 500 --budget-s 300",
          "  --report r.json --plot p.png"),
         "mcp-cli tune repo/model --slo-p99-ms 10 --objective latency --apply")
def tune(
    entry: Path = typer.Argument(..., help="The repository entry to tune: DIR/NAME."),
    slo_p99_ms: float = typer.Option(..., "--slo-p99-ms", help="The latency SLO: p99 in milliseconds."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "-c", min=1,
                                              help="The load: N clients in closed loop (default 8)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="The load: R requests/s, Poisson arrivals."),
    objective: Objective = typer.Option(Objective.throughput, "--objective", case_sensitive=False,
                                        help="throughput: the most req/s whose p99 meets the SLO; latency: "
                                             "the lowest p99 at this load."),
    budget_s: float = typer.Option(120.0, "--budget-s", help="Time for the whole search, seconds."),
    window_s: float = typer.Option(1.0, "--window-s", min=0.1, help="Measurement window, seconds."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="The request: the first sample of this .npz."),
    dims: Optional[str] = typer.Option(None, "--dims", metavar="NAME=SIZE[,...]",
                                       help="Request sizes by the model's symbols (default: free dims at 128)."),
    pairs: int = typer.Option(5, "--confirm-pairs", min=3, max=50,
                              help="Pairs of baseline/best re-measurements that confirm the best."),
    margin: float = typer.Option(0.05, "--margin", min=0.0, max=10.0,
                                 help="The confirmed gain must exceed 1 + margin at the interval's lower end."),
    report_path: Optional[Path] = typer.Option(None, "--report", dir_okay=False, help="Write the report as JSON."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", dir_okay=False,
                                             help="Write p99 vs throughput of every trial as a PNG."),
    apply_best: bool = typer.Option(False, "--apply", help="Rewrite the entry's config.pbtxt with the best setting, "
                                    "when the pairs confirm it beat the baseline beyond noise."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing --report / --plot files."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Choose the serving parameters (dynamic batching and queue delay, instances and threads,
    batch sizes) that give the most throughput within a p99 latency SLO, measured on a local Triton.

    The entry's own config is the baseline; each trial reloads the model with a config override.
    The best is then re-measured against the baseline in alternating pairs: --apply writes it only
    when the median paired ratio's 90% interval is above 1 + --margin (otherwise: "no configuration
    beat the baseline beyond noise", config untouched, exit 0). Progress goes to stderr. Exit 1 when no trial meets the SLO (naming the
    best p99 seen; the report and plot are still written); exit 2 for bad flags or a budget too small
    for one trial. Ctrl-C reloads the original config and stops the server.
    """
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler.files import check_output

        from .loadgen import Load
        from .tune import SloNotMetError, apply, plot, write_report
        from .tune import tune as run_tune

        if concurrency is not None and rate is not None:
            raise UsageError("give one load: --concurrency or --rate")
        if rate is not None and not rate > 0:
            raise UsageError(f"--rate must be positive, got {rate}")
        if not slo_p99_ms > 0:
            raise UsageError(f"--slo-p99-ms must be positive, got {slo_p99_ms}")
        for path, flag in ((report_path, "--report"), (plot_path, "--plot")):
            if path is not None:
                check_output(path, flag, force=force, inputs=(entry / "config.pbtxt",))
        if plot_path is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise UsageError("--plot needs matplotlib: pip install 'mcp-cli[serve]'") from None
        load = Load(rate=rate) if rate is not None else Load(concurrency=concurrency or 8)
        r = run_tune(entry, load, slo_p99_ms, budget_s=budget_s, objective=str(objective), window_s=window_s,
                     inputs=inputs, progress=_progress(rep), dims=parse_dims(dims), pairs=pairs, margin=margin)
        if apply_best and r.confirmed:
            r.applied = str(apply(entry, r.best.setting))
        if r.best is not None and r.best.confirmation is not None:
            r.best.confirmation["applied"] = bool(r.applied)
        if report_path is not None:
            write_report(r, report_path)
        if plot_path is not None:
            plot(r, plot_path)
        rep.json(r.to_dict())
        if not json_out:
            _tuned(rep, r, apply_best)
        if r.best is None:
            from .tune import describe as _short

            t = _closest_trial(r)
            best_p99 = (f"{t.point.p99_ms} ms ({_short(t.setting)}, {t.point.throughput:.1f} req/s)" if t
                        else "none (every trial failed)")
            raise SloNotMetError(f"no trial met p99 <= {slo_p99_ms:g} ms at {r.load} without errors; "
                                 f"the best p99 seen: {best_p99}")

    run(rep, debug, body)


def _tuned(rep, r, apply_best: bool) -> None:  # noqa: ANN001 - tune.TuneReport
    from .tune import describe as _short

    b, best = r.baseline, r.best
    rep.out.print(f"{r.model} at {r.load}, SLO p99 {r.slo_p99_ms:g} ms: {len(r.trials)} trials in {r.spent_s:.0f} s",
                  markup=False)
    if b.point is not None:
        rep.out.print(f"  baseline  {_short(b.setting)}: {b.point.throughput:.1f} req/s, p99 {b.point.p99_ms} ms",
                      markup=False)
    if best is not None:
        gain = f" ({best.point.throughput / b.point.throughput:.2f}x the baseline)" if b.point and b.point.throughput else ""
        rep.out.print(f"  best      {_short(best.setting)}: {best.point.throughput:.1f} req/s, p99 {best.point.p99_ms} ms"
                      f"{gain}", markup=False)
    if r.timeout_trial is not None and r.timeout_trial.point is not None:
        t = r.timeout_trial.to_dict()
        rep.out.print(f"  with inference_timeout_ms {r.timeout_trial.setting.inference_timeout_ms}: "
                      f"{t['rejected_fraction']:.1%} of requests rejected, p99 {t['p99_ms']} ms", markup=False)
    c = best.confirmation if best is not None else None
    if c is not None:
        rep.out.print(f"  confirmation ({len(c['pairs'])} alternating pairs): {c['verdict']}", markup=False)
    if r.applied:
        rep.out.print(f"  applied to {r.applied}", markup=False)
    elif apply_best:
        why = (_closest(r) if best is None
               else "the baseline is the best" if c is None and best.setting == b.setting
               else "no configuration beat the baseline beyond noise" if c is not None
               else "the best was not confirmed")
        rep.out.print(f"  {why}: config.pbtxt left as it is", markup=False)


def _closest_trial(r):  # noqa: ANN001, ANN202 - tune.TuneReport -> its Trial with the lowest p99, or None
    measured = [t for t in r.trials if t.point is not None and t.point.p99_ms is not None]
    return min(measured, key=lambda x: x.point.p99_ms) if measured else None


def _closest(r) -> str:  # noqa: ANN001 - tune.TuneReport
    """No trial met the SLO: which came closest (the lowest p99), and what it gave."""
    from .tune import describe as _short

    t = _closest_trial(r)
    if t is None:
        return "no trial met the SLO (every trial failed)"
    return (f"no trial met the SLO; the closest was {_short(t.setting)}: p99 {t.point.p99_ms} ms, "
            f"{t.point.throughput:.1f} req/s")


COMMANDS = [serve, verify, deploy, server_status, undeploy, bench, tune]
