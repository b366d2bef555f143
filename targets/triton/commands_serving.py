"""The serving loop's commands: serve (a local Triton), deploy (to a running one; `--kserve`
hands over to commands_kube), status and undeploy."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mcp_compiler.cli.common import DebugOpt, JsonOpt, parse_dims, reporter, run
from mcp_compiler.errors import ServerError, UsageError

from .commands_common import TRITON_PORTS, ConnectionFlags, command, with_connection
from .commands_kube import kserve_command, percent_list


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
    openai_port: Optional[int] = typer.Option(None, "--openai-port", min=0, max=65535, rich_help_panel="LLM",
                                              help="Also serve the repository's LLM entries through an OpenAI-"
                                              "compatible API (/v1/models, /v1/completions, /v1/chat/completions) "
                                              "on this port (0: a free one)."),
    openai_host: str = typer.Option("127.0.0.1", "--openai-host", rich_help_panel="LLM",
                                    help="The address the OpenAI API listens on (default 127.0.0.1 only)."),
    openai_api_key: Optional[str] = typer.Option(None, "--openai-api-key", envvar="MCP_OPENAI_API_KEY",
                                                 rich_help_panel="LLM", show_envvar=True,
                                                 help="Clients of the OpenAI API must send this key "
                                                 "(Authorization: Bearer KEY)."),
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

    --openai-port also serves the LLM entries (decoder LLMs converted from GGUF or ONNX) through an
    OpenAI-compatible API, streamed as server-sent events; with --tls-cert it is HTTPS too.
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
        if openai_port is not None and tls.client_ca is not None:
            raise UsageError("--openai-port with --tls-client-ca: the OpenAI front has no client certificate for "
                             "Triton's mutual TLS (give --tls-cert/--tls-key only, and --openai-api-key)")
        if openai_host != "127.0.0.1" and openai_port is None:
            raise UsageError("--openai-host goes with --openai-port")
        ports, notes = _ports(http_port, grpc_port, metrics_port)
        notes += tls.notes
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
                front = None
                if openai_port is not None:
                    front = _openai_front(server, tls, openai_host, openai_port, openai_api_key)
                _serving(rep, server, repository, notes, models, mode, tls, front)
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


def _openai_front(server, tls, host: str, port: int, key: str | None):  # noqa: ANN001, ANN202
    """The OpenAI-compatible front (openai_front.FrontServer) beside the started server; its
    url and the LLM entries it found."""
    import asyncio

    from .openai_front import Front, FrontServer

    front = Front(server.grpc_url, ssl=bool(tls), root_cert=str(tls.cert) if tls else None, api_key=key)
    fs = FrontServer(front, host=host, port=port, ssl_certfile=str(tls.cert) if tls else None,
                     ssl_keyfile=str(tls.key) if tls else None)
    try:
        bound = fs.start()
    except (RuntimeError, OSError, SystemExit) as e:
        raise ServerError(f"--openai-port {port}: the OpenAI API could not listen on {host}:{port} ({e})") from None
    fs.url = f"{'https' if tls else 'http'}://{host}:{bound}"
    fs.keyed = key is not None
    fs.models = sorted(asyncio.run_coroutine_threadsafe(front.models(), fs.loop).result(30)) if fs.loop else []
    return fs


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

    def __init__(self, cert: Path | None = None, key: Path | None = None, client_ca: Path | None = None,
                 notes: list[str] | None = None) -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.notes = notes or []   # certificates that expire soon

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
    """Checked before the server starts (pem.py): both of --tls-cert and --tls-key or neither,
    the certificate parsing and within its dates, the key parsing, not encrypted and the
    certificate's own, --tls-client-ca (only with them) a CA that parses and is valid; a
    certificate expiring within two weeks is a note."""
    from . import pem

    if (cert is None) != (key is None):
        raise UsageError("--tls-cert and --tls-key go together (the server's certificate and its private key)")
    if client_ca is not None and cert is None:
        raise UsageError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
    if cert is None:
        return _Tls()
    notes = pem.expiring(pem.pair(cert, key), cert)
    if client_ca is not None:
        notes += pem.expiring(pem.certificates(client_ca), client_ca)
    return _Tls(*(Path(p).resolve() if p is not None else None for p in (cert, key, client_ca)), notes=notes)


def _serving(rep, server, repository: Path, notes: list[str], models: list[dict], mode: str,  # noqa: ANN001
             tls: _Tls | None = None, front=None) -> None:  # noqa: ANN001 - openai_front.FrontServer
    tls = tls or _Tls()
    grpc = f"{'grpcs' if tls else 'grpc'}://{server.grpc_url}"
    openai = f"{front.url}/v1" if front is not None else None
    rep.json({"http": f"http://{server.http_url}", "grpc": grpc, "openai": openai,
              "openai_models": front.models if front is not None else None,
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
    if openai:
        rep.out.print(f"  OpenAI   {openai}  ({', '.join(front.models) or 'no LLM entry loaded yet'}; "
                      f"{'a key required' if front.keyed else 'no key'})", markup=False)
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
    model_version: Optional[int] = typer.Option(None, "--model-version", min=1, max=2**63 - 1,
                                                help="Version number on the server "
                                                "(default: the entry's newest version folder)."),
    version: Optional[int] = typer.Option(None, "--version", hidden=True, min=1, max=2**63 - 1,
                                          help="Same as --model-version."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name on the server (default: the config's)."),
    wait_timeout: float = typer.Option(600.0, "--wait-timeout", help="Seconds to wait for READY (a big LLM takes minutes to load)."),
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
    analysis_min_requests: int = typer.Option(50, "--analysis-min-requests", rich_help_panel="Kubernetes (KServe)",
                                              help="With --canary-steps: fewer canary requests in 5 minutes make a "
                                              "measurement inconclusive (the rollout pauses), not a pass."),
    analysis_failure_limit: int = typer.Option(1, "--analysis-failure-limit", rich_help_panel="Kubernetes (KServe)",
                                               help="With --canary-steps: failed measurements allowed before the "
                                               "rollout is aborted."),
    analysis_count: Optional[int] = typer.Option(None, "--analysis-count", rich_help_panel="Kubernetes (KServe)",
                                                 help="With --canary-steps: measurements in all (default: one a "
                                                 "minute until the rollout ends)."),
    kube_version: str = typer.Option("1.30", "--kube-version", metavar="1.N", rich_help_panel="Kubernetes (KServe)",
                                     help="The cluster's Kubernetes release: the manifests are validated against its "
                                     "schemas (1.25 or newer)."),
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
    check_image: bool = typer.Option(False, "--check-image-runtime", rich_help_panel="Kubernetes (KServe)",
                                     help="Run the entry in the image's onnxruntime (installed once in a cached "
                                     "venv) and in the verified one on the same samples: the difference printed, "
                                     "nothing written outside the entry's execution budget."),
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
            return kserve_command(rep, entry, json_out, dockerfile, output, force, apply, plain, kubeconfig, conn.timeout,
                           check_image, dict(storage_uri=storage_uri, namespace=namespace, name=service_name,
                                min_replicas=min_replicas, max_replicas=max_replicas, canary_percent=canary_percent,
                                promote=promote, tune_report=from_tune, image=image, service_account=service_account,
                                canary_steps=percent_list(canary_steps), max_p99_ms=max_p99_ms,
                                prometheus_url=prometheus_url, step_pause=step_pause, kube_version=kube_version,
                                analysis_min_requests=analysis_min_requests,
                                analysis_failure_limit=analysis_failure_limit, analysis_count=analysis_count,
                                model_version=model_version if model_version is not None else version))
        k8s_only = [f for f, v in (("--storage-uri", storage_uri), ("--canary-percent", canary_percent),
                                   ("--from-tune", from_tune), ("--image", image), ("--apply", apply),
                                   ("--promote", promote), ("--service-account", service_account),
                                   ("--canary-steps", canary_steps), ("--max-p99-ms", max_p99_ms),
                                   ("--kube-version", kube_version != "1.30"),
                                   ("--check-image-runtime", check_image)) if v]
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
    wait_timeout: float = typer.Option(300.0, "--wait-timeout", help="Seconds to wait for the unload to finish."),
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
