"""What every command shares: the run wrapper (errors -> one line and an exit code, the `--json`
envelope), the common options, and parsers for flag values."""

from __future__ import annotations

import contextlib
import enum
import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from mcp_compiler.errors import McpError, UsageError

# Nothing heavy at import: `--version`, `--help`, `targets` and `passes` load neither onnx,
# onnxruntime nor numpy; each command imports what it uses when it runs.

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
MAX_DIM = 2**31 - 1   # a dimension Triton's config (int64) and onnxruntime both hold, and no more


def reporter(json_mode: bool = False):  # noqa: ANN201 - report.Reporter (rich: imported late)
    from mcp_compiler.report import Reporter

    return Reporter(json_mode=json_mode)


def _traceback() -> None:
    import traceback

    traceback.print_exc()


_PATH_ERRNOS = (errno.ENAMETOOLONG, errno.ELOOP)


def _stdout_gone() -> None:
    """Later writes to stdout (a flush at exit) go nowhere instead of failing again."""
    import os

    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.close(fd)
    except OSError:
        pass


def run(rep, debug: bool, fn: Callable[[], Any]) -> None:  # noqa: ANN001 - report.Reporter
    """Run a command body; every failure becomes one line on stderr (and, with --json, the error
    envelope on stdout) and an exit code. With --json, what the body handed to `rep.json` is
    printed once, as {"ok": true, ...}."""
    if debug:
        import logging

        logging.basicConfig(level=logging.DEBUG)
    try:
        fn()
    except typer.Exit as e:
        rep.finish(ok=e.exit_code == 0)   # a code the command chose (zoo: some models failed)
        raise
    except McpError as e:
        if debug:
            _traceback()
        rep.fail(type(e).__name__, str(e), e.exit_code)
        raise typer.Exit(e.exit_code) from None
    except BrokenPipeError:   # stdout's reader went away (`| head`): nothing more to say, as `yes | head`
        _stdout_gone()
        raise SystemExit(128 + 13) from None
    except KeyboardInterrupt:
        rep.fail("Interrupted", "interrupted", 130)
        raise SystemExit(130) from None   # not typer.Exit(130): that is typer's own silent Ctrl-C (_Group.main)
    except Exception as e:  # noqa: BLE001 - anything else is a bug: say so in one line
        if isinstance(e, OSError) and e.errno in _PATH_ERRNOS and e.filename is not None:
            # a path the user gave that no file can have (a name too long, a loop of links)
            rep.fail("UsageError", f"{str(e.filename)[:200]}: {e.strerror}", EXIT_BAD_INPUT)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        if debug:
            _traceback()
        rep.fail("InternalError", f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
                 EXIT_FAILED)
        raise typer.Exit(EXIT_FAILED) from None
    rep.finish(ok=True)


@contextlib.contextmanager
def watchdog(rep, seconds: float, what: str):  # noqa: ANN001, ANN201 - report.Reporter; a context manager
    """Inside it, the process ends after `seconds` with one error line (exit 1,
    TimeoutExceededError): the only way out of an onnxruntime run that never returns (a signal
    handler would wait for it). Leaving it cancels the timer (an in-process caller goes on)."""
    import os
    import sys
    import threading

    def fire() -> None:
        from mcp_compiler.files import undo_before_hard_exit

        undo_before_hard_exit()   # what was being written (a convert's staging folder) goes first
        rep.fail("TimeoutExceededError", f"{what} took longer than {seconds:g} s (--timeout)", 1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    try:
        yield
    finally:
        t.cancel()


DebugOpt = typer.Option(False, "--debug", help="Show tracebacks and debug logs.")
JsonOpt = typer.Option(False, "--json", help="Print one JSON object (for CI): "
                       '{"ok": true, ...} or {"ok": false, "error": {...}}.')


EXAMPLE_WIDTH = 76   # "$ " and the command within an 80-column terminal's help (1 column of padding each side)


def examples(*commands: str | tuple[str, ...]) -> str:
    """An "Examples" epilog for a command's --help: one command a line, each of them pasting whole
    at 80 columns; a command too long for one line is a tuple of its lines, shown with `\\`
    continuations."""
    shown = []
    for c in commands:
        lines = (c,) if isinstance(c, str) else c
        marks = ["$"] + [" "] * (len(lines) - 1)
        ends = [" \\"] * (len(lines) - 1) + [""]
        shown.append("\n".join(f"{m} {line}{e}" for m, line, e in zip(marks, lines, ends)))
    return "[bold]Examples[/bold]\n\n" + "\n\n".join(shown)


def paragraphs(text: str) -> str:
    """A command's help as rich renders it best: each paragraph one line (the terminal wraps it at
    its own width; a docstring's own line breaks would break sentences mid-way at 80 columns)."""
    import inspect

    return "\n\n".join(" ".join(line.strip() for line in para.splitlines())
                       for para in inspect.cleandoc(text).split("\n\n"))


class Choice(str, enum.Enum):
    """An option's fixed set of values, matched case-insensitively (typer `case_sensitive=False`)."""

    def __str__(self) -> str:
        return self.value


def parse_dims(text: str | None, flag: str = "--dims") -> dict[str, int]:
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


def parse_ints(text: str | None, flag: str) -> list[int] | None:
    """`1,4,8` -> [1, 4, 8]."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected N[,N...], got {text!r}") from None


def tri_state(text: str | None, flag: str) -> bool | None:
    if text is None or text.lower() == "auto":
        return None
    if text.lower() in ("true", "on", "yes", "1"):
        return True
    if text.lower() in ("false", "off", "no", "0"):
        return False
    raise UsageError(f"{flag}: expected true, false or auto, got {text!r}")


def one_model(positional: Path | None, option: Path | None, what: str = "MODEL",
              missing: str = "the .onnx file to convert (e.g. `mcp-cli convert model.onnx ...`)") -> Path:
    """The model, given as the positional argument or (the older spelling) --input."""
    if positional is not None and option is not None and positional != option:
        raise UsageError(f"give the {what} once: as an argument or with --input, not both")
    model = positional if positional is not None else option
    if model is None:
        raise UsageError(f"missing {what}: {missing}")
    return model


def write_json(path: Path, data: dict) -> None:
    """A JSON report, written atomically (a temp file beside it, then renamed)."""
    import json
    import os
    import tempfile

    from mcp_compiler.files import follow_umask, temp_prefix, write_error

    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        follow_umask(fd)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise write_error(path, e) from None
