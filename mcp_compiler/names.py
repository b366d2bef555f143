"""Entry names: what every target accepts as a model name (a folder or file name inside the
output, never a path), and the default one for a model file. One function confines names for
every target, the CLI's --name and the zoo manifest's names alike."""

from __future__ import annotations

import re

from mcp_compiler.errors import UsageError

# A folder/file name without separators or dot-files (what Triton accepts as a model name too).
_NAME_OK = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def sanitize_name(stem: str) -> str:
    """A model name from a file stem: anything outside [A-Za-z0-9_.-] becomes '_'."""
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", stem).lstrip(".-") or "model"
    return name[:128]


def check_name(name: str, *, what: str = "model name") -> str:
    """`name` if it is safe as a folder name and a server-side model name; else one usage line.
    Every name that becomes a path or a server identifier (--name, a config's `name:`, a zoo
    entry, undeploy's NAME, a KServe model name) passes here before anything is sent or written."""
    if not isinstance(name, str) or not _NAME_OK.fullmatch(name) or ".." in name:
        raise UsageError(f"{what} {name!r} is not accepted: use letters, digits, '_', '.', '-' "
                         "(no path separators, not starting with '.' or '-', at most 128 characters)")
    return name
