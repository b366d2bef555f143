"""The mcp-cli command line: parse options, call the library, render, map errors to exit codes.

`application.py` builds the typer app from the compiler's commands (`compile.py`, `zoo.py`) and each
target's own (`Target.commands()`, registered by `main` only when the command run may be one of
them); `common.py` holds what every command shares. `app` (every command registered), `main` and
`entry` (the console script) are loaded on first use, so that a target's commands may import `common` first.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("app", "main", "entry"):
        from . import application

        return application.with_target_commands() if name == "app" else getattr(application, name)
    raise AttributeError(name)
