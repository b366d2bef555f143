"""The Triton target's commands: serve, verify, deploy, status, undeploy.

Registered on the mcp-cli app through `TritonTarget.commands()`; each parses its options, calls
this package's library code, and renders through the shared reporter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer

from mcp_compiler.cli.common import Choice, DebugOpt, JsonOpt, examples, one_model, parse_dims, reporter, run
from mcp_compiler.errors import ServerError, UsageError

TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}   # tritonserver's own defaults


def command(name: str, *lines: str) -> Callable[[Callable], Callable]:
    def mark(fn: Callable) -> Callable:
        fn.__command_name__, fn.__examples__ = name, examples(*lines) if lines else None
        return fn
    return mark


class Protocol(Choice):
    grpc = "grpc"
    http = "http"


@command("serve", "mcp-cli serve model_repository", "mcp-cli serve model_repository --explicit --grpc-port 0")
def serve(
    repository: Path = typer.Argument(..., help="The model repository folder."),
    http_port: Optional[int] = typer.Option(None, "--http-port", min=0, max=65535,
                                            help="Default: 8000, or a free port if 8000 is taken; 0: a free port."),
    grpc_port: Optional[int] = typer.Option(None, "--grpc-port", min=0, max=65535,
                                            help="Default: 8001, or a free port if taken; 0: a free port."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", min=0, max=65535,
                                               help="Default: 8002, or a free port if taken; 0: a free port."),
    explicit: bool = typer.Option(False, "--explicit", help="Start with no model loaded "
                                  "(model-control-mode explicit, for `deploy`)."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Start a local Triton Inference Server on 127.0.0.1 for REPOSITORY (Ctrl-C stops it).

    A port you give that is taken is an error; the defaults are Triton's own (8000, 8001, 8002),
    each replaced by a free port when taken. With --json, one JSON object when the server is
    ready (its URLs and models), then it serves until stopped.
    """
    rep = reporter(json_out)

    def body() -> None:
        import signal

        from .serve import TritonServer

        def stop(signum, frame):  # noqa: ANN001, ANN202
            raise KeyboardInterrupt

        # SIGTERM (kill, a service manager) stops it like Ctrl-C: the server and its folder go
        signal.signal(signal.SIGTERM, stop)
        ports, notes = _ports(http_port, grpc_port, metrics_port)
        # A model that fails to load is reported, not fatal: the others keep serving.
        server = TritonServer(repository, explicit=explicit, http_port=ports["http"], grpc_port=ports["grpc"],
                              metrics_port=ports["metrics"],
                              extra_args=["--exit-on-error=false", "--strict-readiness=false"])
        failed = True
        try:
            with rep.status("starting tritonserver"):
                server.start()
            _serving(rep, server, repository, notes)
            failed = _wait(server)
        finally:
            # the temporary folder goes, unless an error names the log in it
            server.close(keep_log=failed and server.log_path.exists() and server.proc is not None)

    run(rep, debug, body)


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


def _serving(rep, server, repository: Path, notes: list[str]) -> None:  # noqa: ANN001
    models = server.models()
    rep.json({"http": f"http://{server.http_url}", "grpc": f"grpc://{server.grpc_url}",
              "metrics": f"http://{server.metrics_url}/metrics", "log": str(server.log_path),
              "notes": notes, "models": models})
    if rep.json_mode:
        rep.finish(ok=True)   # printed now: the server runs until stopped
        return
    for note in notes:
        rep.out.print(f"note: {note}", markup=False)
    rep.out.print(f"Triton is serving {repository}\n  HTTP     http://{server.http_url}\n"
                  f"  gRPC     grpc://{server.grpc_url}\n  metrics  http://{server.metrics_url}/metrics\n"
                  f"  log      {server.log_path}", markup=False)
    for m in models:
        reason = f" ({m['reason']})" if m.get("reason") else ""
        rep.out.print(f"  model {m['name']} v{m.get('version', '?')}: {m.get('state', '?')}{reason}", markup=False)
    rep.out.print("Ctrl-C stops it.", markup=False)


def _wait(server) -> bool:  # noqa: ANN001 - serve.TritonServer
    """Until Ctrl-C or SIGTERM (False: stopped as asked); the server exiting by itself raises."""
    import sys
    import time

    try:
        while server.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        sys.stderr.write("stopping tritonserver\n")
        return False
    raise ServerError(f"tritonserver exited with code {server.proc.returncode} (log: {server.log_path})")


@command("verify", "mcp-cli verify model.onnx model_repository/model",
         "mcp-cli verify model.onnx model_repository/model --samples 4 --dims batch=2 --json")
def verify(
    model: Optional[Path] = typer.Argument(None, help="The original ONNX model.", dir_okay=False, show_default=False),
    entry: Optional[Path] = typer.Argument(None, help="The emitted entry: DIR/NAME.", show_default=False),
    input: Optional[Path] = typer.Option(None, "--input", "-i", hidden=True, dir_okay=False,
                                         help="The original model, the older way."),
    repository: Optional[Path] = typer.Option(None, "--repository", "-r", hidden=True,
                                              help="The entry, the older way."),
    samples: int = typer.Option(1, "--samples", min=1, help="Random input sets to compare."),
    dims: Optional[str] = typer.Option(None, "--dims", metavar="NAME=SIZE[,...]", help="Symbol sizes, e.g. "
                                       "batch=2,H=64 (default: sizes the model's ops accept, found from its shapes)."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="Compare on your own inputs: an .npz "
                                          "(arrays named like the inputs) or a folder of them."),
    rtol: float = typer.Option(1e-3, "--rtol", help="Relative tolerance."),
    atol: float = typer.Option(1e-4, "--atol", help="Absolute tolerance."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Run the original in onnxruntime and the emitted entry through its serving runtime; compare."""
    rep = reporter(json_out)

    def body() -> None:
        from .verify import verify as run_verify

        original = one_model(model, input, "MODEL")
        where = entry if entry is not None else repository
        if where is None:
            raise UsageError("missing ENTRY: the emitted DIR/NAME to compare (e.g. `mcp-cli verify "
                             "model.onnx model_repository/model`)")
        r = run_verify(original, where, samples=samples, dims=parse_dims(dims), rtol=rtol, atol=atol,
                       inputs=inputs)
        rep.verified(r)
        r.raise_if_failed()

    run(rep, debug, body)


UrlOpt = typer.Option(..., "--url", help="The Triton server, HOST:PORT (its gRPC or HTTP port).")
ProtoOpt = typer.Option(Protocol.grpc, "--protocol", case_sensitive=False, help="grpc or http.")
SslOpt = typer.Option(False, "--ssl", help="TLS (gRPC; Triton's HTTP endpoint has no TLS of its own).")
RootOpt = typer.Option(None, "--root-cert", help="CA certificate to check the server with.")
CertOpt = typer.Option(None, "--client-cert", help="Client certificate, for mutual TLS.")
KeyOpt = typer.Option(None, "--client-key", help="Client private key, for mutual TLS.")
TokenOpt = typer.Option(None, "--token", help="Auth token sent as a header (default: $MCP_API_KEY). Never printed.")
HeaderOpt = typer.Option("mcp-api-key", "--token-header",
                         help="Header that carries the token (the key of the server's "
                              "--grpc-restricted-protocol / --http-restricted-api setting).")
TimeoutOpt = typer.Option(60.0, "--timeout", help="Network timeout, seconds.")


def _connection(url: str, protocol: Protocol, ssl: bool, root_cert: Optional[Path], client_cert: Optional[Path],  # noqa: ANN202
                client_key: Optional[Path], token: Optional[str], token_header: str, timeout: float):
    import os

    from .deploy import Connection

    if (client_cert is None) != (client_key is None):
        raise UsageError("--client-cert and --client-key go together")
    if (root_cert or client_cert) and not ssl:
        raise UsageError("--root-cert/--client-cert need --ssl")
    if ":" not in url or url.startswith(("http://", "https://", "grpc://")):
        raise UsageError(f"--url: expected HOST:PORT, got {url!r}")
    return Connection(url, str(protocol), ssl, root_cert, client_cert, client_key,
                      token or os.environ.get("MCP_API_KEY") or None, token_header, timeout)


@command("deploy", "mcp-cli deploy model_repository/model --url 127.0.0.1:8001",
         "mcp-cli deploy model_repository/model --url triton:8001 --ssl --root-cert ca.pem --rollback-on-failure",
         "mcp-cli deploy model_repository/model --url 127.0.0.1:8001 --dry-run --json")
def deploy(
    entry: Path = typer.Argument(..., help="The repository entry to push: DIR/NAME."),
    url: str = UrlOpt, protocol: Protocol = ProtoOpt,
    model_version: Optional[int] = typer.Option(None, "--model-version", help="Version number on the server "
                                                "(default: the entry's newest version folder)."),
    version: Optional[int] = typer.Option(None, "--version", hidden=True, help="Same as --model-version."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name on the server (default: the config's)."),
    wait_timeout: float = typer.Option(120.0, "--wait-timeout", help="Seconds to wait for READY."),
    smoke: bool = typer.Option(True, "--smoke/--no-smoke", help="Run one inference after loading."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="The smoke request: the first sample of "
                                          "this .npz (or folder of them), arrays named like the inputs "
                                          "(default: inputs the model accepts, found from its shapes)."),
    rollback: bool = typer.Option(False, "--rollback-on-failure",
                                  help="If the smoke inference fails, load the last good deploy again."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be sent, send nothing."),
    ssl: bool = SslOpt, root_cert: Optional[Path] = RootOpt, client_cert: Optional[Path] = CertOpt,
    client_key: Optional[Path] = KeyOpt, token: Optional[str] = TokenOpt, token_header: str = HeaderOpt,
    timeout: float = TimeoutOpt, json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Upload a model to a running Triton (model repository extension), wait for READY, smoke-test it."""
    rep = reporter(json_out)

    def body() -> None:
        from .deploy import deploy as run_deploy

        if version is not None and model_version is not None and version != model_version:
            raise UsageError("give the version once: --model-version")
        conn = _connection(url, protocol, ssl, root_cert, client_cert, client_key, token, token_header, timeout)
        with rep.status(f"deploying {entry} to {conn.describe()}"):
            r = run_deploy(entry, conn, name=name, version=model_version if model_version is not None else version,
                           wait_timeout=wait_timeout, dry_run=dry_run, smoke=smoke, rollback_on_failure=rollback,
                           inputs=inputs)
        rep.json(r.to_dict())
        if not json_out:
            _deployed(rep, r, conn)

    run(rep, debug, body)


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
    rep.out.print(f"deployed {r.name} v{r.version} to {r.url}{prev}: READY in {r.load_seconds:.2f} s"
                  f"{smoke_txt}, {r.upload_bytes / 2**20:.1f} MiB uploaded", markup=False)


@command("status", "mcp-cli status --url 127.0.0.1:8001", "mcp-cli status --url 127.0.0.1:8000 --protocol http --json")
def server_status(
    url: str = UrlOpt, protocol: Protocol = ProtoOpt, ssl: bool = SslOpt, root_cert: Optional[Path] = RootOpt,
    client_cert: Optional[Path] = CertOpt, client_key: Optional[Path] = KeyOpt,
    token: Optional[str] = TokenOpt, token_header: str = HeaderOpt, timeout: float = TimeoutOpt,
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """List the models and versions a Triton server has, and their state."""
    rep = reporter(json_out)

    def body() -> None:
        from .deploy import status as run_status

        rows = run_status(_connection(url, protocol, ssl, root_cert, client_cert, client_key, token,
                                      token_header, timeout))
        rep.json({"models": rows})
        if json_out:
            return
        if not rows:
            rep.out.print("no models", markup=False)
        for m in rows:
            reason = f" ({m['reason']})" if m.get("reason") else ""
            rep.out.print(f"{m['name']} v{m.get('version') or '?'}: {m.get('state') or 'UNKNOWN'}{reason}", markup=False)

    run(rep, debug, body)


@command("undeploy", "mcp-cli undeploy mymodel --url 127.0.0.1:8001")
def undeploy(
    name: str = typer.Argument(..., help="The model to unload."),
    url: str = UrlOpt, protocol: Protocol = ProtoOpt, ssl: bool = SslOpt, root_cert: Optional[Path] = RootOpt,
    client_cert: Optional[Path] = CertOpt, client_key: Optional[Path] = KeyOpt,
    token: Optional[str] = TokenOpt, token_header: str = HeaderOpt, timeout: float = TimeoutOpt,
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Unload a model from a running Triton."""
    rep = reporter(json_out)

    def body() -> None:
        from .deploy import undeploy as run_undeploy

        run_undeploy(name, _connection(url, protocol, ssl, root_cert, client_cert, client_key, token,
                                       token_header, timeout))
        rep.json({"name": name, "unloaded": True})
        if not json_out:
            rep.out.print(f"unloaded {name}", markup=False)

    run(rep, debug, body)


COMMANDS = [serve, verify, deploy, server_status, undeploy]
