"""Every command's --help reads right at 80 and at 120 columns: descriptions are wrapped by the
terminal, never broken mid-sentence by a hand-wrapped docstring; every example pastes whole; no
literal `[...]` is eaten by rich's markup."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from mcp_compiler.cli.application import with_target_commands
from mcp_compiler.cli.common import EXAMPLE_WIDTH

APP = with_target_commands()
CLICK = typer.main.get_command(APP)
COMMANDS = sorted(CLICK.commands)
STYLE_TAGS = {"bold", "/bold", "dim", "/dim", "italic", "/italic", "cyan", "/cyan", "red", "/red", "green", "/green",
              "yellow", "/yellow", "/"}
RICH_TAG = re.compile(r"(\\*)\[([a-z#/@][^[]*?)]")   # what rich's markup takes for a tag


def _help(args: list[str], width: int) -> list[str]:
    r = CliRunner().invoke(APP, [*args, "--help"], env={"COLUMNS": str(width), "TERM": "dumb", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    return lines


def _description(lines: list[str]) -> list[list[str]]:
    """The paragraphs between the usage line and the first panel."""
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("╭")), len(lines))
    paras, cur = [], []
    for line in lines[start:end] + [""]:
        if line.strip():
            cur.append(line.rstrip())
        elif cur:
            paras.append(cur)
            cur = []
    return paras


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_descriptions_are_wrapped_by_the_terminal_not_by_hand(command, width):
    lines = _help([command] if command else [], width)
    for para in _description(lines):
        for line, after in zip(para, para[1:]):
            # a line rich broke has no room left for the next word; a hand-broken one has
            assert len(line) + 1 + len(after.split()[0]) > width - 2, f"{command} --help at {width}:\n{line}\n{after}"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_example_pastes_whole_at_80_columns(command):
    epilog = CLICK.commands[command].epilog or ""
    shown = "\n".join(_help([command], 80))
    examples = [line.strip() for line in epilog.splitlines() if line.strip().startswith(("$", "-"))]
    assert examples or command in ("passes", "targets") or not epilog, epilog
    for line in epilog.splitlines():
        if line.strip() and not line.startswith("["):
            assert len(line) <= EXAMPLE_WIDTH, f"{command}: example line over {EXAMPLE_WIDTH} columns: {line}"
            assert line.rstrip() in shown, f"{command}: {line!r} is not shown whole at 80 columns"


def _texts(command) -> list[str]:
    out = [command.help or "", command.epilog or ""]
    for p in command.params:
        out += [getattr(p, "help", None) or "", getattr(p, "rich_help_panel", None) or ""]
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_no_literal_brackets_are_taken_for_markup(command):
    for text in _texts(CLICK.commands[command]):
        for m in RICH_TAG.finditer(text):
            if len(m.group(1)) % 2:   # escaped: \[kube] shows as [kube]
                continue
            assert m.group(2) in STYLE_TAGS, f"{command}: [{m.group(2)}] would be eaten by rich; write \\[{m.group(2)}]"


def test_option_help_is_one_paragraph():
    for name, c in CLICK.commands.items():
        for p in c.params:
            assert "\n" not in (getattr(p, "help", None) or ""), f"{name} {p.name}: help wrapped by hand"

