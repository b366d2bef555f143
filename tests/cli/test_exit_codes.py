"""The exit-code table of docs/errors.md is the code's: every McpError class the package defines is a row,
with the exit code the class carries, and the row's class exists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

from _helpers import REPO as ROOT

from mcp_compiler.errors import McpError


def _table() -> dict[str, int]:
    section = (ROOT / "docs" / "errors.md").read_text()
    return {m.group(2): int(m.group(1)) for m in re.finditer(r"^\| (\d+) \| `(\w+)` \|", section, re.M)}


def _error_classes() -> dict[str, type]:
    import mcp_compiler.passes
    import mcp_compiler.targets

    found = {}
    # the subpackages one by one: an editable install maps passes/ and targets/ from elsewhere
    mods = [m for pkg in (mcp_compiler, mcp_compiler.passes, mcp_compiler.targets)
            for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    for mod in mods:
        if ".runtime" in mod.name or mod.name.endswith("__main__"):
            continue   # the serving runtime imports nothing of the compiler
        try:
            m = importlib.import_module(mod.name)
        except ImportError:   # an optional extra (matplotlib, ...) not installed
            continue
        for name, obj in inspect.getmembers(m, inspect.isclass):
            if issubclass(obj, McpError) and obj.__module__ == m.__name__:
                found[name] = obj
    return found


def test_every_error_class_is_in_the_readme_table_with_its_exit_code():
    table, classes = _table(), _error_classes()
    assert "NotLoadedError" in classes and "DeployError" in classes   # the walk reaches the targets
    missing = sorted(set(classes) - set(table) - {"McpError"})
    assert not missing, f"error classes missing from docs/errors.md's exit-code table: {missing}"
    wrong = {n: (table[n], c.exit_code) for n, c in classes.items() if n in table and table[n] != c.exit_code}
    assert not wrong, f"docs/errors.md code vs class exit_code: {wrong}"
    stale = sorted(set(table) - set(classes))
    assert not stale, f"docs/errors.md rows for classes that do not exist: {stale}"
