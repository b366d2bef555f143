"""The mcp-cli command line: parse options, call mcp_compiler.api, render, map errors to exit codes."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer

from . import __version__, api
from .errors import McpError
from .report import Reporter

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


@app.command()
def convert(
    input: Path = typer.Option(..., "--input", "-i", help="The ONNX model to convert.",
                               dir_okay=False),
    output: Path = typer.Option(..., "--output", "-o",
                                help="Where to write: a .mcpir file (written atomically)."),
    check: bool = typer.Option(True, "--check/--no-check", help="Run onnx.checker on the input."),
    infer_shapes: bool = typer.Option(True, "--infer-shapes/--no-infer-shapes",
                                      help="Run ONNX shape inference before import."),
    json_out: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Convert an ONNX model into MCP-IR (.mcpir)."""
    rep = Reporter(json_mode=json_out)

    def body() -> None:
        with rep.status(f"converting {input}"):
            report = api.convert(input, output, api.ConvertOptions(check=check, infer_shapes=infer_shapes))
        rep.converted(report)

    _run(rep, debug, body)


@app.command()
def inspect(
    file: Path = typer.Argument(..., help="An ONNX (.onnx) or MCP-IR (.mcpir) file."),
    json_out: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Show a model's inputs/outputs (symbolic dims, layout), ops, weights and opsets."""
    rep = Reporter(json_mode=json_out)
    _run(rep, debug, lambda: rep.summary(api.inspect(file), str(file)))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
