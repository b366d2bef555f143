"""The mcp-cli command line: parse options, call the library, render, map errors to exit codes.

`application.py` builds the typer app from the compiler's commands (`compile.py`, `zoo.py`) and each
target's own (`Target.commands()`, registered by `main` only when the command run may be one of
them); `common.py` holds what every command shares. `app` (every command registered) and `main`
are loaded on first use, so that a target's commands may import `common` first; `entry` (the
console script) sets the collector before it loads them.
"""

from __future__ import annotations


def collect_seldom() -> None:
    """A graph of N nodes is some 10 N Python objects, made at once and alive until the command
    ends; the collector's default (a pass every 700 allocations, each older pass walking more of
    them) took a tenth of a 100k-node convert, and 5 ms of loading the modules. The command is
    one short process: collect seldom. (Library callers keep their own settings.)"""
    import gc

    gc.set_threshold(100_000, 50, 100)


def entry() -> None:
    """The `mcp-cli` console script (application.entry), the collector set before the modules load.
    A Ctrl-C while the modules load (the first ~100 ms, before a command's own handling) is the
    same one line and exit 130 as later, not a traceback of the imports: until they are loaded it
    ends the process at once (nothing is written yet), then Ctrl-C is KeyboardInterrupt again."""
    import _signal as signal  # the signal module's C part: built in, no import of its own (enum)
    import sys

    loading = signal.getsignal(signal.SIGINT) is signal.default_int_handler   # not where it is ignored
    if loading:
        signal.signal(signal.SIGINT, _interrupted_while_loading)
    collect_seldom()
    import os

    from .application import entry as run

    if loading:
        _preload(sys.argv[1:])
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run()
    except KeyboardInterrupt:   # (between parsing and a command's own handler)
        sys.stderr.write("error: interrupted\n")
        sys.stderr.flush()
        os._exit(130)   # not the interpreter's teardown: a half-imported module's finalizers would speak


# The native modules a compiler command imports first thing: loaded while a Ctrl-C still ends the
# process at once. A KeyboardInterrupt raised inside a C++ extension's initialisation (onnx's
# nanobind module) is a C++ exception nothing catches: the process aborts with a traceback.
_PRELOAD = {"convert": ("numpy", "onnx"), "inspect": ("numpy", "onnx"), "verify": ("numpy", "onnx"),
            "zoo": ("numpy", "onnx")}


def _preload(argv: list[str]) -> None:
    if not argv or "-h" in argv or "--help" in argv:
        return
    import importlib

    for module in _PRELOAD.get(argv[0], ()):
        try:
            importlib.import_module(module)
        except ImportError:   # the command says what is missing, in its own words
            return


def _interrupted_while_loading(signum: int, frame: object) -> None:
    import os

    os.write(2, b"error: interrupted\n")
    os._exit(130)


def __getattr__(name: str) -> object:
    if name in ("app", "main"):
        from . import application

        return application.with_target_commands() if name == "app" else getattr(application, name)
    raise AttributeError(name)
