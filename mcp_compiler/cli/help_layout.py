"""`--help` that reads at 80 columns: each panel's options in two columns, the flags (never cut)
and their help (wrapped).

typer's rich help lays an option out in six columns (long and short flags, the negative pair,
the type, the help) and rich shrinks them all to fit: at 80 columns `convert --help` cut 25 flag
names to `--calibration-da…`. Here the flags of an option stand one to a line (`--flag
METAVAR`, then its `--no-flag`), in a column that is never wrapped or cut and is as wide as its
longest line (NAME_WIDTH at most: longer forms go on lines of their own), and the help takes the
rest. Installed over typer's panel printer (`typer.rich_utils._print_options_panel`) where that
exists with the keywords it is called with; another typer keeps its own layout.
"""

from __future__ import annotations

NAME_WIDTH = 32   # the flag column's widest line where a flag and its metavar would share one


def install() -> None:
    try:
        from typer import rich_utils as ru
    except ImportError:   # typer without rich: click's plain help, which never cuts a flag
        return
    if getattr(ru, "_mcp_layout", False) or not all(
            hasattr(ru, n) for n in ("_print_options_panel", "_get_parameter_help", "Panel", "Table", "STYLE_OPTION",
                                  "STYLE_NEGATIVE_OPTION", "STYLE_TYPES", "STYLE_REQUIRED_SHORT",
                                  "STYLE_OPTIONS_PANEL_BORDER", "ALIGN_OPTIONS_PANEL")):
        return
    ru._print_options_panel = _panel_printer(ru)
    ru._mcp_layout = True


def flag_lines(param, ctx) -> list[tuple[str, str]]:  # noqa: ANN001 - a click Parameter, its Context
    """The lines of an option's flag column: (text, style kind) with kind option, negative, metavar
    or required."""
    if getattr(param, "param_type_name", "") == "argument":   # (typer may carry a click of its own)
        return [((param.metavar or param.name or "").upper(), "option")]
    metavar = param.make_metavar(ctx=ctx)
    if getattr(param, "is_flag", False) or "bool" in (metavar or "").lower():
        metavar = ""
    names = sorted(param.opts, key=lambda o: not o.startswith("--"))   # long flags first, in their order
    joined = ", ".join(names)
    lines: list[tuple[str, str]] = []
    if metavar and len(joined) + 1 + len(metavar) <= NAME_WIDTH:
        lines.append((f"{joined} {metavar}", "option"))
    else:
        lines += [(n, "option") for n in names] if len(joined) > NAME_WIDTH else [(joined, "option")]
        if metavar:
            lines.append((f"  {metavar}", "metavar"))
    lines += [(n, "negative") for n in param.secondary_opts]
    return lines


def _panel_printer(ru):  # noqa: ANN001, ANN202 - typer.rich_utils; the replacement printer
    from rich.text import Text

    styles = {"option": ru.STYLE_OPTION, "negative": ru.STYLE_NEGATIVE_OPTION, "metavar": ru.STYLE_TYPES}

    def print_options_panel(*, name, params, ctx, markup_mode, console, **_kw) -> None:  # noqa: ANN001
        if not params:
            return
        table = ru.Table(show_header=False, box=None, expand=True, padding=(0, 1), pad_edge=False)
        table.add_column(no_wrap=True, overflow="ignore")
        table.add_column(ratio=1, overflow="fold")   # (a long URL default folds, never cut)
        for p in params:
            cell = Text(no_wrap=True)
            for i, (line, kind) in enumerate(flag_lines(p, ctx)):
                if i:
                    cell.append("\n")
                if i == 0 and getattr(p, "required", False):
                    cell.append("* ", style=ru.STYLE_REQUIRED_SHORT)
                cell.append(line, style=styles[kind])
            table.add_row(cell, _one_text(ru._get_parameter_help(param=p, ctx=ctx, markup_mode=markup_mode)))
        console.print(ru.Panel(table, border_style=ru.STYLE_OPTIONS_PANEL_BORDER, title=name,
                               title_align=ru.ALIGN_OPTIONS_PANEL))

    return print_options_panel


def _one_text(help):  # noqa: ANN001, ANN202 - typer's Columns of Text (help, env var, default, required)
    """typer's help pieces as one wrapped Text: in its Columns each piece is cut to a column's
    width (a URL default lost its port); one Text folds what it cannot wrap."""
    from rich.text import Text

    items = getattr(help, "renderables", None)
    if not items or not all(isinstance(t, Text) for t in items):
        return help
    out = Text(" ").join(items)
    out.overflow = "fold"
    return out
