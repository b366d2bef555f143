"""The mcp-cli app: the commands, registered; `main` maps usage errors to exit codes.

The compiler's commands are in `compile.py` and `zoo.py`; each target adds its own (Triton's
serve, deploy, status, undeploy, verify) through `Target.commands()` (`with_target_commands`).
"""

from __future__ import annotations

import sys
from typing import Optional

import typer
from typer.core import TyperGroup

from mcp_compiler import __version__

from .common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, examples, paragraphs  # noqa: F401 - the exit-code table
from .compile import CONVERT_EXAMPLES, convert, inspect, list_passes, list_targets
from .zoo import ZOO_EXAMPLES, zoo


def _exceptions():  # noqa: ANN202 - click's exceptions module
    try:   # typer >= 0.26 carries its own click
        from typer._click import exceptions as cx
    except ImportError:
        from click import exceptions as cx
    return cx


def _strict_numbers() -> None:
    """Numbers on the command line as users type them: ASCII digits only (Python's int() and
    float() take Arabic-Indic and other digits, so `--runs ٣` was 3 on some flags and refused on
    others), and a float flag is finite (`--seconds inf` measured forever, `--budget-s nan` never
    ended). One rule for every int and float option, at click's conversion."""
    import math

    try:   # the click typer parses with (its own from 0.26): not both, importing click costs 4 ms a run
        from typer._click import types
    except ImportError:
        from click import types
    base = types._NumberParamTypeBase
    if getattr(base, "_mcp_strict", False):
        return
    convert = base.convert

    def strict(self, value, param, ctx):  # noqa: ANN001, ANN202
        if isinstance(value, str) and not value.strip().isascii():
            self.fail(f"{value!r} is not a number written in ASCII digits", param, ctx)
        got = convert(self, value, param, ctx)
        if isinstance(got, float) and not math.isfinite(got):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return got

    base.convert = strict
    base._mcp_strict = True


_strict_numbers()


class _Group(TyperGroup):
    """Usage errors (unknown flag, bad value) are one line on stderr and exit 2, and with
    --json also the error envelope on stdout; not click's boxed message."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: ANN001, ANN202
        cx = _exceptions()
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except cx.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":   # `mcp-cli` alone: the help was printed
                sys.exit(e.exit_code)
            _usage_error(e, sys.argv[1:] if args is None else list(args))
            sys.exit(EXIT_BAD_INPUT)
        except (getattr(cx, "Abort", typer.Abort), typer.Abort):
            _interrupted(sys.argv[1:] if args is None else list(args))
            sys.exit(130)
        except (getattr(cx, "Exit", typer.Exit), typer.Exit) as e:   # --help, --version, a command's exit code
            sys.exit(getattr(e, "exit_code", 0))
        if rv == 130:   # typer's answer to a Ctrl-C outside a command's body (parsing, its own code): silent
            _interrupted(sys.argv[1:] if args is None else list(args))
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _interrupted(argv: list[str]) -> None:
    _failed(argv, "Interrupted", "interrupted", 130)


def _usage_error(e, argv: list[str]) -> None:  # noqa: ANN001 - click.UsageError
    where = f"{e.ctx.command_path}: " if e.ctx is not None else ""
    hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
    _failed(argv, "UsageError", f"{where}{e.format_message()}", EXIT_BAD_INPUT, hint)


def _failed(argv: list[str], kind: str, message: str, code: int, hint: str = "") -> None:
    """What failed before a command's body (whose Reporter does this): the error line, and with
    --json the error envelope."""
    import json

    sys.stderr.write(f"error: {message}{hint}\n")
    if "--json" in argv:
        sys.stdout.write(json.dumps({"ok": False, "error": {"type": kind, "message": message, "exit_code": code}},
                                    indent=2) + "\n")


from .help_layout import install as _install_help_layout  # noqa: E402

_install_help_layout()   # flags never cut at 80 columns

app = typer.Typer(
    cls=_Group,
    name="mcp-cli",
    help="Compile ONNX models to MCP-IR and Triton Inference Server model repositories.\n\n"
         "Exit codes: 0 ok, 1 conversion or verification failed, 2 bad usage or bad input.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


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


def _register(fn, name: str | None = None, epilog: str | None = None) -> None:  # noqa: ANN001 - a command function
    """A command, its help written as paragraphs (the terminal wraps them, at any width)."""
    import inspect

    app.command(name, help=paragraphs(inspect.getdoc(fn) or ""), epilog=epilog)(fn)


_register(convert, epilog=CONVERT_EXAMPLES)
_register(inspect, epilog=examples("mcp-cli inspect model.onnx", "mcp-cli inspect model.mcpir --values --json"))
_register(list_passes, "passes", epilog=examples("mcp-cli passes --json"))
_register(list_targets, "targets", epilog=examples("mcp-cli targets --json"))
_register(zoo, epilog=ZOO_EXAMPLES)


def _name(c) -> str:  # noqa: ANN001 - typer's CommandInfo
    from typer.main import get_command_name

    return c.name or get_command_name(c.callback.__name__)


_COMPILER_COMMANDS = frozenset(_name(c) for c in app.registered_commands)


def with_target_commands() -> typer.Typer:
    """`app` with each target's own commands (Triton's serve, deploy, ...) registered, once; a
    compiler command run from the command line does not load them (3 ms of every convert)."""
    if not any(hasattr(c.callback, "__command_name__") for c in app.registered_commands):
        from mcp_compiler.targets import TARGETS

        for t in TARGETS.values():
            for fn in t().commands():
                _register(fn, fn.__command_name__, epilog=getattr(fn, "__examples__", None))
    return app


def _no_bool_metavar() -> None:
    """typer 0.29 prints `<bool>` beside every flag in --help (a flag takes no value): drop it."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:   # typer < 0.29 prints no type beside a flag
        return

    def display_type_rich(self, ctx):  # noqa: ANN001, ANN202
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_no_bool_metavar()


def main() -> None:
    """The `mcp-cli` command."""
    import gc

    from . import collect_seldom

    gc.freeze()   # the modules' objects: never walked by a collection
    collect_seldom()
    first = sys.argv[1:2]
    if not (first and first[0] in _COMPILER_COMMANDS):
        with_target_commands()
    _only_command(first)
    app()


def _only_command(first: list[str]) -> None:
    """When the first argument names a command, typer builds that command's click command only,
    not all twelve (each evaluates its annotations and makes its options: 6 ms a run). What the
    user sees is the same: a subcommand's parsing, help and errors never look at its siblings."""
    chosen = [c for c in app.registered_commands if first and _name(c) == first[0]]
    if chosen:
        app.registered_commands = chosen


def entry() -> None:
    """The `mcp-cli` console script: main(), then the process ends without the interpreter's
    teardown, which frees every object one by one (0.4 s after a 100k-node convert). The exit
    handlers still run and the output is flushed; with another thread alive it exits normally."""
    import atexit
    import os
    import threading

    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):   # sys.exit("message"): what Python itself does with it
        sys.stderr.write(f"{code}\n")
        code = 1
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe (`| head`), a closed stream: nothing to do
            pass
    os._exit(code)




if __name__ == "__main__":
    main()
