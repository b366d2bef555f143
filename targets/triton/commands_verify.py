"""The convert side's command: verify (the original in onnxruntime against the entry in its
serving runtime)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from mcp_compiler.cli.common import DebugOpt, JsonOpt, one_model, parse_dims, reporter, run
from mcp_compiler.errors import UsageError

from .commands_common import command


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
