"""The mcp-cli command line: parse options, call mcp_compiler.api, render, map errors to exit codes."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer

from . import __version__
from .errors import McpError, ServerError, UsageError

# Nothing heavy at import: `--version`, `--help`, `targets` and `passes` load neither onnx,
# onnxruntime nor numpy; each command imports what it uses when it runs.


def Reporter(json_mode: bool = False):  # noqa: ANN201, N802 - stands for the class, imported late
    from .report import Reporter as _Reporter

    return _Reporter(json_mode=json_mode)

app = typer.Typer(
    name="mcp-cli",
    help="Compile ONNX models to MCP-IR and Triton Inference Server model repositories.\n\n"
         "Exit codes: 0 ok, 1 conversion or verification failed, 2 bad usage or bad input.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mcp-cli {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                           help="Print the version and exit."),
) -> None:
    """mcp-cli: ONNX -> MCP-IR -> Triton model repository."""


def _run(reporter: Reporter, debug: bool, fn: Callable[[], None]) -> None:
    """Run a command body; every failure becomes one line on stderr and an exit code."""
    if debug:
        logging.basicConfig(level=logging.DEBUG)
    try:
        fn()
    except typer.Exit:
        raise  # an exit code the command chose (e.g. zoo: some models failed), already reported
    except McpError as e:
        if debug:
            traceback.print_exc()
        reporter.error(str(e))
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        reporter.error("interrupted")
        raise typer.Exit(130) from None
    except Exception as e:  # noqa: BLE001 - anything else is a bug: say so in one line
        if debug:
            traceback.print_exc()
        reporter.error(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)")
        raise typer.Exit(EXIT_FAILED) from None


DebugOpt = typer.Option(False, "--debug", help="Show tracebacks and debug logs.")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object (for CI) instead of text.")


MAX_DIM = 2**31 - 1   # a dimension Triton's config (int64) and onnxruntime both hold, and no more


def _parse_dims(text: str | None, flag: str = "--dims") -> dict[str, int]:
    """`batch=2,H=64` -> {"batch": 2, "H": 64}; sizes are ASCII digits, 1..MAX_DIM."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = part.partition("=")
        value = value.strip()
        if not sep or not key.strip() or not (value.isascii() and value.isdigit()):
            raise UsageError(f"{flag}: expected NAME=SIZE[,NAME=SIZE...] with SIZE in ASCII digits, got {part!r}")
        if not 1 <= int(value) <= MAX_DIM:
            raise UsageError(f"{flag}: {key.strip()}={value} is outside 1..{MAX_DIM}")
        out[key.strip()] = int(value)
    return out


def _write_report(path: Path, data: dict) -> None:
    """A JSON report, written atomically (a temp file beside it, then renamed)."""
    import json
    import os
    import tempfile

    from .files import follow_umask, write_error

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        follow_umask(fd)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise write_error(path, e) from None


def _tri_state(text: str | None, flag: str) -> bool | None:
    if text is None or text.lower() == "auto":
        return None
    if text.lower() in ("true", "on", "yes", "1"):
        return True
    if text.lower() in ("false", "off", "no", "0"):
        return False
    raise UsageError(f"{flag}: expected true, false or auto, got {text!r}")


@app.command()
def convert(
    input: Path = typer.Option(..., "--input", "-i", help="The ONNX (or .mcpir) model to convert.",
                               dir_okay=False),
    output: Optional[str] = typer.Option(  # str: typer would read "" as Path(".")
        None, "--output", "-o",
        help="Without --target: the .mcpir file to write. With --target: the model repository "
             "folder (default: model_repository)."),
    target: Optional[str] = typer.Option(None, "--target", "-t",
                                         help="Emit for this target (see `mcp-cli targets`)."),
    name: Optional[str] = typer.Option(None, "--name", help="Model name in the repository "
                                       "(default: the input file's stem, sanitized)."),
    backend: str = typer.Option("python", "--backend",
                                help="Triton backend: python (MCP-IR + bundled runtime) or onnxruntime."),
    force: bool = typer.Option(False, "--force", help="Replace an existing DIR/NAME or .mcpir file."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML build file with serving "
                                          "parameters (flags override it)."),
    dynamic_batch: Optional[str] = typer.Option(
        None, "--dynamic-batch", metavar="true|false|auto",
        help="Dynamic batching: auto (default) turns it on when every input and output has the "
             "same batch symbol at axis 0; true makes that a requirement."),
    no_dynamic_batch: bool = typer.Option(False, "--no-dynamic-batch", help="Same as --dynamic-batch false."),
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size"),
    preferred_batch_size: Optional[str] = typer.Option(None, "--preferred-batch-size", metavar="N[,N...]"),
    max_queue_delay_us: Optional[int] = typer.Option(None, "--max-queue-delay-us"),
    max_concurrent_requests: Optional[int] = typer.Option(
        None, "--max-concurrent-requests", help="Bound on queued requests (dynamic batching queue size)."),
    inference_timeout_ms: Optional[int] = typer.Option(
        None, "--inference-timeout-ms", help="Queue timeout; requests waiting longer are rejected."),
    instance_count: Optional[int] = typer.Option(None, "--instance-count"),
    kind: Optional[str] = typer.Option(None, "--kind", help="Instance kind: cpu or gpu."),
    tensor_parallel_size: Optional[int] = typer.Option(None, "--tensor-parallel-size"),
    quantization_level: Optional[str] = typer.Option(
        None, "--quantize", "--quantization-level", metavar="none|int4|fp8",
        help="Quantize constant MatMul/Gemm weights: int4 (group-wise, weight-only) or fp8. "
             "An accuracy report against onnxruntime on the original follows."),
    group_size: int = typer.Option(32, "--group-size", help="int4: weights per group (16..256)."),
    symmetric: bool = typer.Option(False, "--symmetric", help="int4: no zero point."),
    int4_format: str = typer.Option("matmulnbits", "--int4-format", metavar="matmulnbits|qdq",
                                    help="int4 lowering: com.microsoft.MatMulNBits (fast on CPU) or "
                                         "DequantizeLinear int4 with block_size (opset 21)."),
    int4_accuracy_level: int = typer.Option(0, "--int4-accuracy-level",
                                            help="MatMulNBits accuracy_level: 0 float compute, 4 int8 "
                                                 "activations (faster on CPU, less exact)."),
    fp8_format: str = typer.Option("e4m3fn", "--fp8-format", metavar="e4m3fn|e5m2"),
    fp8_per_tensor: bool = typer.Option(False, "--fp8-per-tensor",
                                        help="fp8: one scale per tensor (default: per output channel)."),
    quantize_conv: bool = typer.Option(False, "--quantize-conv", help="Quantize Conv weights too "
                                       "(int4 needs --int4-format qdq)."),
    quantize_exclude: Optional[list[str]] = typer.Option(
        None, "--quantize-exclude", metavar="PATTERN",
        help="Leave nodes or weights whose name matches this glob in float (repeatable)."),
    quantize_min_elements: int = typer.Option(4096, "--quantize-min-elements",
                                              help="Weights with fewer values stay in float."),
    quantize_max_error: Optional[float] = typer.Option(
        None, "--quantize-max-error", help="Leave a layer in float when its relative weight error "
                                           "(||w - q|| / ||w||) exceeds this."),
    calibration_data: Optional[Path] = typer.Option(
        None, "--calibration-data", help="Folder of .npz input samples: inputs for the accuracy "
                                         "report and, with fp8, static activation Q/DQ scales."),
    accuracy_budget: Optional[str] = typer.Option(
        None, "--accuracy-budget", metavar="KEY=V[,...]",
        help="Fail (exit 1, nothing written) when the quantized model is outside it: cos=MIN, "
             "top1=MIN, max-abs=MAX, rel=MAX, checked on every float output."),
    accuracy_samples: int = typer.Option(2, "--accuracy-samples",
                                         help="Random input sets for the accuracy report (0: none)."),
    fold_size_limit: Optional[float] = typer.Option(
        None, "--fold-size-limit", metavar="MB",
        help="Constant folding may produce tensors up to this size (default 1 MB; larger only "
             "when not larger than the inputs). Raise it to materialize generated weights."),
    layout: str = typer.Option("nchw", "--layout", metavar="nchw|nhwc",
                               help="nhwc: 4-D image inputs (and image outputs) become channels-last "
                                    "[N, H, W, C]; transposes inside move and cancel. verify feeds "
                                    "the original NCHW the transposed inputs."),
    opset: Optional[int] = typer.Option(None, "--opset", help="Raise the model's ai.onnx opset to "
                                        "this first (onnx version converter); fusions then use the "
                                        "newer ops: HardSwish 14, LayerNormalization 17, Gelu 20."),
    model_warmup: Optional[bool] = typer.Option(None, "--warmup/--no-warmup",
                                                help="Add a model_warmup built from the contract."),
    prepack: Optional[bool] = typer.Option(None, "--prepack/--no-prepack",
                                           help="onnxruntime weight prepacking in the served model "
                                                "(--no-prepack: load in milliseconds from the mapped "
                                                "weights, no packed copy in memory)."),
    warmup_dims: Optional[str] = typer.Option(None, "--warmup-dims", help="Symbol sizes for the "
                                              "warm-up inputs, e.g. H=64,W=64."),
    verify_: bool = typer.Option(False, "--verify", help="Run `verify` on the result (exit 1 if it fails)."),
    dims: Optional[str] = typer.Option(None, "--dims", help="Symbol sizes for --verify, e.g. N=2,H=64 "
                                       "(default: sizes the model's ops accept, found from its shapes)."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="Your own inputs for --verify and the "
                                          "accuracy report: an .npz (arrays named like the inputs) or a "
                                          "folder of them."),
    passes: Optional[str] = typer.Option(None, "--passes", metavar="NAME[,NAME...]",
                                         help="Run these passes instead of the default pipeline "
                                              "(see `mcp-cli passes`)."),
    disable_pass: Optional[list[str]] = typer.Option(None, "--disable-pass", help="Skip a pass (repeatable)."),
    verify_each: bool = typer.Option(False, "--verify-each", help="Check IR invariants after every pass."),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Write the conversion report (JSON) here."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show per-pass times and node counts."),
    check: bool = typer.Option(True, "--check/--no-check", help="Run onnx.checker on the input."),
    load_check: bool = typer.Option(True, "--load-check/--no-load-check",
                                    help="Load the emitted model in its serving runtime before the "
                                         "entry is moved into place."),
    infer_shapes: bool = typer.Option(True, "--infer-shapes/--no-infer-shapes",
                                      help="Run ONNX shape inference before import."),
    json_out: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Convert an ONNX model to MCP-IR (.mcpir) or, with --target, to a Triton model repository."""
    rep = Reporter(json_mode=json_out)

    def body() -> None:
        from onnx.defs import onnx_opset_version

        from .accuracy import parse_budget

        from . import api

        opts = api.ConvertOptions(check=check, infer_shapes=infer_shapes, target=target, name=name,
                                  backend=backend, force=force, verify=verify_,
                                  verify_dims=_parse_dims(dims),
                                  passes=[p.strip() for p in passes.split(",") if p.strip()] if passes else None,
                                  disabled_passes=set(disable_pass or ()), verify_each=verify_each,
                                  accuracy_budget=parse_budget(accuracy_budget),
                                  accuracy_samples=accuracy_samples, opset=opset, layout=layout,
                                  load_check=load_check, inputs=str(inputs) if inputs else None,
                                  fold_size_limit=None if fold_size_limit is None else int(fold_size_limit * 2**20),
                                  calibration_data=str(calibration_data) if calibration_data else None)
        if report_path is not None:
            from .files import check_output

            check_output(report_path, "--report")
        if fold_size_limit is not None and not fold_size_limit >= 0:
            raise UsageError(f"--fold-size-limit must be >= 0 MB, got {fold_size_limit}")
        if opset is not None and not 1 <= opset <= onnx_opset_version():
            raise UsageError(f"--opset {opset}: onnx knows opsets 1..{onnx_opset_version()}")
        level = quantization_level
        if target is not None:
            from .targets.triton.params import load_build_file, resolve

            pref = None
            if preferred_batch_size is not None:
                try:
                    pref = [int(x) for x in preferred_batch_size.split(",") if x.strip()]
                except ValueError:
                    raise UsageError(f"--preferred-batch-size: expected N[,N...], got {preferred_batch_size!r}") from None
            flags = {
                "dynamic_batch": False if no_dynamic_batch else _tri_state(dynamic_batch, "--dynamic-batch"),
                "max_batch_size": max_batch_size, "preferred_batch_size": pref,
                "max_queue_delay_us": max_queue_delay_us,
                "max_concurrent_requests": max_concurrent_requests,
                "inference_timeout_ms": inference_timeout_ms, "instance_count": instance_count,
                "kind": kind, "tensor_parallel_size": tensor_parallel_size,
                "quantization_level": quantization_level, "model_warmup": model_warmup,
                "warmup_dims": _parse_dims(warmup_dims, "--warmup-dims") if warmup_dims else None,
                "prepack": prepack,
            }
            if _tri_state(dynamic_batch, "--dynamic-batch") is None and not no_dynamic_batch:
                flags["dynamic_batch"] = None
            opts.serving = resolve(load_build_file(config) if config else {}, flags)
            level = opts.serving.quantization_level
        elif config is not None or dynamic_batch is not None:
            raise UsageError("--config and --dynamic-batch need --target")
        if level not in (None, "none"):
            from .passes.quantize import QuantizeOptions   # (loads every pass: only when quantizing)

            opts.quantize = QuantizeOptions(
                mode=level, block_size=group_size, symmetric=symmetric, int4_format=int4_format,
                accuracy_level=int4_accuracy_level, fp8_format=fp8_format, per_channel=not fp8_per_tensor,
                conv=quantize_conv, exclude=list(quantize_exclude or ()),
                min_elements=quantize_min_elements, max_error=quantize_max_error).validate()
        elif accuracy_budget or calibration_data:
            raise UsageError("--accuracy-budget and --calibration-data need --quantize int4|fp8")
        with rep.status(f"converting {input}"):
            if output == "":
                raise UsageError("--output: empty path")
            report = api.convert(input, None if output is None else Path(output), opts)
        if report_path is not None:
            _write_report(report_path, report.to_dict())
        rep.converted(report, verbose=verbose)

    _run(rep, debug, body)


@app.command()
def verify(
    input: Path = typer.Option(..., "--input", "-i", help="The original ONNX model.", dir_okay=False),
    repository: Path = typer.Option(..., "--repository", "-r", help="The emitted entry: DIR/NAME."),
    samples: int = typer.Option(1, "--samples", min=1, help="Random input sets to compare."),
    dims: Optional[str] = typer.Option(None, "--dims", help="Symbol sizes, e.g. batch=2,H=64 "
                                       "(default: sizes the model's ops accept, found from its shapes)."),
    inputs: Optional[Path] = typer.Option(None, "--inputs", help="Compare on your own inputs: an .npz "
                                          "(arrays named like the inputs) or a folder of them."),
    rtol: float = typer.Option(1e-3, "--rtol"),
    atol: float = typer.Option(1e-4, "--atol"),
    json_out: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Run the original in onnxruntime and the emitted model through its serving runtime; compare."""
    rep = Reporter(json_mode=json_out)

    def body() -> None:
        from .verify import verify as run_verify

        r = run_verify(input, repository, samples=samples, dims=_parse_dims(dims), rtol=rtol, atol=atol,
                       inputs=inputs)
        rep.verified(r)
        r.raise_if_failed()

    _run(rep, debug, body)


@app.command("passes")
def list_passes(json_out: bool = JsonOpt) -> None:
    """List the passes --passes and --disable-pass accept, in default-pipeline order."""
    from .passes import PASSES

    rep = Reporter(json_mode=json_out)
    import sys

    rows = [{"name": n, "summary": (sys.modules[c.__module__].__doc__ or c.__doc__ or "").strip().splitlines()[0],
             "requires": sorted(p.value for p in c.requires),
             "establishes": sorted(p.value for p in c.establishes)} for n, c in PASSES.items()]
    if json_out:
        rep.json(rows)
    else:
        for r in rows:
            needs = f" (needs {', '.join(r['requires'])})" if r["requires"] else ""
            rep.out.print(f"{r['name']}: {r['summary']}{needs}", markup=False)


@app.command()
def targets(json_out: bool = JsonOpt) -> None:
    """List the targets --target accepts."""
    from .targets import TARGETS

    rep = Reporter(json_mode=json_out)
    rows = [{"name": t.name, "runtime": t.runtime, "opsets": list(t.opset_range),
             "description": t.description} for t in TARGETS.values()]
    if json_out:
        rep.json(rows)
    else:
        for r in rows:
            rep.out.print(f"{r['name']}: {r['description']}; runs on {r['runtime']}, "
                          f"ai.onnx opsets {r['opsets'][0]}..{r['opsets'][1]}", markup=False)


TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}   # tritonserver's own defaults


@app.command()
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
    debug: bool = DebugOpt,
) -> None:
    """Start a local Triton Inference Server on 127.0.0.1 for REPOSITORY (Ctrl-C stops it).

    A port you give that is taken is an error; the defaults are Triton's own (8000, 8001, 8002),
    each replaced by a free port when taken.
    """
    rep = Reporter()

    def body() -> None:
        import signal
        import time

        from .serve import TritonServer, port_free

        def stop(signum, frame):  # noqa: ANN001, ANN202
            raise KeyboardInterrupt

        # SIGTERM (kill, a service manager) stops it like Ctrl-C: the server and its folder go
        signal.signal(signal.SIGTERM, stop)

        ports, notes = {}, []
        for kind, given in (("http", http_port), ("grpc", grpc_port), ("metrics", metrics_port)):
            if given is None:
                default = TRITON_PORTS[kind]
                given = default if port_free(default) else 0
                if not given:
                    notes.append(f"port {default} ({kind}) is taken: serving {kind} on a free port")
            ports[kind] = given
        # A model that fails to load is reported, not fatal: the others keep serving.
        server = TritonServer(repository, explicit=explicit, http_port=ports["http"], grpc_port=ports["grpc"],
                              metrics_port=ports["metrics"],
                              extra_args=["--exit-on-error=false", "--strict-readiness=false"])
        failed = True
        try:
            with rep.status("starting tritonserver"):
                server.start()
            for note in notes:
                rep.out.print(f"note: {note}", markup=False)
            rep.out.print(f"Triton is serving {repository}\n  HTTP     http://{server.http_url}\n"
                          f"  gRPC     grpc://{server.grpc_url}\n  metrics  http://{server.metrics_url}/metrics\n"
                          f"  log      {server.log_path}", markup=False)
            for m in server.models():
                reason = f" ({m['reason']})" if m.get("reason") else ""
                rep.out.print(f"  model {m['name']} v{m.get('version', '?')}: {m.get('state', '?')}{reason}",
                              markup=False)
            rep.out.print("Ctrl-C stops it.", markup=False)
            while server.proc.poll() is None:
                time.sleep(0.5)
            raise ServerError(f"tritonserver exited with code {server.proc.returncode} (log: {server.log_path})")
        except KeyboardInterrupt:
            rep.out.print("stopping tritonserver", markup=False)
            failed = False
        finally:
            # the temporary folder goes, unless an error names the log in it
            server.close(keep_log=failed and server.log_path.exists() and server.proc is not None)

    _run(rep, debug, body)


@app.command()
def inspect(
    file: Path = typer.Argument(..., help="An ONNX (.onnx) or MCP-IR (.mcpir) file."),
    values: bool = typer.Option(False, "--values", help="Also list every node output's shape."),
    json_out: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Show a model's inputs/outputs with their shape contracts (symbolic dims and expressions
    such as (H - 1) // 32 + 1, from symbolic shape inference), layout, ops, weights and opsets;
    the dims inference had to assume equal, and any that conflict."""
    rep = Reporter(json_mode=json_out)
    def body() -> None:
        from . import api

        rep.summary(api.inspect(file, values=values), str(file))

    _run(rep, debug, body)


def _connection(url: str, protocol: str, ssl: bool, root_cert: Optional[Path], client_cert: Optional[Path],
                client_key: Optional[Path], token: Optional[str], token_header: str, timeout: float):
    import os

    from .deploy import Connection

    if (client_cert is None) != (client_key is None):
        raise UsageError("--client-cert and --client-key go together")
    if (root_cert or client_cert) and not ssl:
        raise UsageError("--root-cert/--client-cert need --ssl")
    if ":" not in url or url.startswith(("http://", "https://", "grpc://")):
        raise UsageError(f"--url: expected HOST:PORT, got {url!r}")
    return Connection(url, protocol, ssl, root_cert, client_cert, client_key,
                      token or os.environ.get("MCP_API_KEY") or None, token_header, timeout)


UrlOpt = typer.Option(..., "--url", help="The Triton server, HOST:PORT (its gRPC or HTTP port).")
ProtoOpt = typer.Option("grpc", "--protocol", help="grpc or http.")
SslOpt = typer.Option(False, "--ssl", help="TLS (gRPC; Triton's HTTP endpoint has no TLS of its own).")
RootOpt = typer.Option(None, "--root-cert", help="CA certificate to check the server with.")
CertOpt = typer.Option(None, "--client-cert", help="Client certificate, for mutual TLS.")
KeyOpt = typer.Option(None, "--client-key", help="Client private key, for mutual TLS.")
TokenOpt = typer.Option(None, "--token", help="Auth token sent as a header (default: $MCP_API_KEY). Never printed.")
HeaderOpt = typer.Option("mcp-api-key", "--token-header",
                         help="Header that carries the token (the key of the server's "
                              "--grpc-restricted-protocol / --http-restricted-api setting).")
TimeoutOpt = typer.Option(60.0, "--timeout", help="Network timeout, seconds.")


@app.command()
def deploy(
    entry: Path = typer.Argument(..., help="The repository entry to push: DIR/NAME."),
    url: str = UrlOpt, protocol: str = ProtoOpt,
    version: Optional[int] = typer.Option(None, "--version", help="Version number on the server "
                                          "(default: the entry's newest version folder)."),
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
    rep = Reporter(json_mode=json_out)

    def body() -> None:
        from .deploy import deploy as run_deploy

        conn = _connection(url, protocol, ssl, root_cert, client_cert, client_key, token, token_header, timeout)
        with rep.status(f"deploying {entry} to {conn.describe()}"):
            r = run_deploy(entry, conn, name=name, version=version, wait_timeout=wait_timeout,
                           dry_run=dry_run, smoke=smoke, rollback_on_failure=rollback, inputs=inputs)
        if json_out:
            rep.json({"ok": True, **r.to_dict()})
            return
        if r.dry_run:
            hdr = f", header {conn.token_header}: ***" if conn.token else ""
            rep.out.print(f"dry run: would load {r.name} v{r.version} on {r.url} "
                          f"({r.upload_bytes} bytes{hdr}):", markup=False)
            for f in r.files:
                rep.out.print(f"  {f}", markup=False)
            return
        prev = f" (replacing v{', v'.join(map(str, r.previous_versions))})" if r.previous_versions else ""
        smoke_txt = f", smoke inference {r.smoke_seconds * 1e3:.1f} ms" if r.smoke_seconds is not None else ""
        rep.out.print(f"deployed {r.name} v{r.version} to {r.url}{prev}: READY in {r.load_seconds:.2f} s"
                      f"{smoke_txt}, {r.upload_bytes / 2**20:.1f} MiB uploaded", markup=False)

    _run(rep, debug, body)


@app.command("status")
def server_status(
    url: str = UrlOpt, protocol: str = ProtoOpt, ssl: bool = SslOpt, root_cert: Optional[Path] = RootOpt,
    client_cert: Optional[Path] = CertOpt, client_key: Optional[Path] = KeyOpt,
    token: Optional[str] = TokenOpt, token_header: str = HeaderOpt, timeout: float = TimeoutOpt,
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """List the models and versions a Triton server has, and their state."""
    rep = Reporter(json_mode=json_out)

    def body() -> None:
        from .deploy import status as run_status

        rows = run_status(_connection(url, protocol, ssl, root_cert, client_cert, client_key, token,
                                      token_header, timeout))
        if json_out:
            rep.json({"ok": True, "models": rows})
            return
        if not rows:
            rep.out.print("no models", markup=False)
        for m in rows:
            reason = f" ({m['reason']})" if m.get("reason") else ""
            rep.out.print(f"{m['name']} v{m.get('version') or '?'}: {m.get('state') or 'UNKNOWN'}{reason}", markup=False)

    _run(rep, debug, body)


@app.command()
def undeploy(
    name: str = typer.Argument(..., help="The model to unload."),
    url: str = UrlOpt, protocol: str = ProtoOpt, ssl: bool = SslOpt, root_cert: Optional[Path] = RootOpt,
    client_cert: Optional[Path] = CertOpt, client_key: Optional[Path] = KeyOpt,
    token: Optional[str] = TokenOpt, token_header: str = HeaderOpt, timeout: float = TimeoutOpt,
    debug: bool = DebugOpt,
) -> None:
    """Unload a model from a running Triton."""
    rep = Reporter()

    def body() -> None:
        from .deploy import undeploy as run_undeploy

        run_undeploy(name, _connection(url, protocol, ssl, root_cert, client_cert, client_key, token,
                                       token_header, timeout))
        rep.out.print(f"unloaded {name}", markup=False)

    _run(rep, debug, body)


@app.command()
def zoo(
    manifest: Path = typer.Argument(..., help="The zoo manifest (zoo.yaml).", dir_okay=False),
    output: str = typer.Option("model_repository", "--output", "-o", help="The model repository to fill."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Parallel processes (default: CPUs)."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="K/N", help="Only the K-th of N deterministic slices."),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Write a JSON report here."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
    cache: Optional[Path] = typer.Option(None, "--cache", help="Cache folder (default ~/.cache/mcp-cli/zoo)."),
    verify_: bool = typer.Option(False, "--verify", help="Verify each model against onnxruntime."),
    allow_outside_paths: bool = typer.Option(False, "--allow-outside-paths",
                                             help="Let source paths point outside the manifest's folder."),
    json_out: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Convert every model of a manifest into one repository (parallel, cached, shardable)."""
    rep = Reporter(json_mode=json_out)

    def body() -> None:
        from .manifest import load_manifest
        from .zoo import parse_shard, run_zoo, write_junit, write_report

        from .files import check_output

        check_output(output, "--output", directory=True)
        for flag, path in (("--report", report_path), ("--junit", junit)):
            if path is not None:
                check_output(path, flag)
        m = load_manifest(manifest, allow_outside_paths=allow_outside_paths)
        sh = parse_shard(shard)
        t0 = __import__("time").perf_counter()
        with rep.zoo_progress() as progress:
            results = run_zoo(m, Path(output), jobs=jobs, shard=sh, cache=cache, verify=verify_, progress=progress)
        wall = __import__("time").perf_counter() - t0
        if report_path:
            write_report(results, report_path, m, sh)
        if junit:
            write_junit(results, junit)
        rep.zoo_done(results, wall)
        failed = [r for r in results if r.status == "failed"]
        if failed:
            raise typer.Exit(1)

    _run(rep, debug, body)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
