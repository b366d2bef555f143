"""The mcp-cli command line: parse options, call the library, render, map errors to exit codes.

`application.py` builds the typer app from the compiler's commands (`compile.py`, `zoo.py`) and each
target's own (`Target.commands()`, registered by `main` only when the command run may be one of
them); `common.py` holds what every command shares. `app` (every command registered) and `main`
are loaded on first use, so that a target's commands may import `common` first; `entry` (the
console script) sets the collector before it loads them.
"""

from __future__ import annotations

from typing import Any


def collect_seldom() -> None:
    """A graph of N nodes is some 10 N Python objects, made at once and alive until the command
    ends; the collector's default (a pass every 700 allocations, each older pass walking more of
    them) took a tenth of a 100k-node convert, and 5 ms of loading the modules. The command is
    one short process: collect seldom. (Library callers keep their own settings.)"""
    import gc

    gc.set_threshold(100_000, 50, 100)


def entry() -> None:
    """The `mcp-cli` console script (application.entry), the collector set before the modules load.
    A Ctrl-C while the modules load (the first ~50 ms, before a command's own handling) is the same
    one line and exit 130 as later, not a traceback of the imports."""
    import sys

    collect_seldom()
    try:
        from .application import entry as run
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(130) from None
    try:
        run()
    except KeyboardInterrupt:   # (between parsing and a command's own handler)
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(130) from None


def __getattr__(name: str) -> Any:
    if name in ("app", "main"):
        from . import application

        return application.with_target_commands() if name == "app" else getattr(application, name)
    raise AttributeError(name)
