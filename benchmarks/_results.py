"""Writes one benchmark's section of benchmarks/RESULTS.md, leaving the other sections alone."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = ("# Benchmark results\n\nEach section is written by the script named in it; rerun that "
          "script to refresh it. Times are medians of the stated number of runs on a shared, "
          "noisy 2-core machine; compare ratios, not absolute seconds.\n")


def write_section(key: str, body: str, path: Path = RESULTS) -> None:
    text = path.read_text() if path.exists() else HEADER
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
