"""Symbolic dimensions: a dim is an int, a symbol name, a ShapeExpr over symbols, or None (unknown)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Union

# The Python spelling of each ShapeExpr operator, also used to print expressions.
BINARY_OPS = {"add": "+", "sub": "-", "mul": "*", "floor_div": "//", "ceil_div": "/^", "mod": "%",
              "max": "max", "min": "min"}


@dataclass(frozen=True)
class ShapeExpr:
    """A binary expression over dims, e.g. ShapeExpr("floor_div", "H", 32) for H // 32."""

    op: str
    lhs: Dim
    rhs: Dim

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"unknown ShapeExpr op {self.op!r}")
        if self.lhs is None or self.rhs is None:
            raise ValueError("ShapeExpr operands must be known dims")

    def symbols(self) -> list[str]:
        return [s for side in (self.lhs, self.rhs) for s in dim_symbols(side)]

    def __str__(self) -> str:   # the text is kept: shape algebra orders and keys terms by it
        text = self.__dict__.get("_text")
        if text is None:
            text = format_dim(self)
            object.__setattr__(self, "_text", text)
        return text


Dim = Union[int, str, ShapeExpr, None]


PLAIN_NAME = re.compile(r"[A-Za-z_][\w.]*")   # a symbol or graph name printed as is


def format_dim(d: Dim, quote: bool = False) -> str:
    """A dim as text: an int, a symbol, `(a op b)` or `max(a, b)`, `?` when unknown. With `quote`,
    a symbol that is not a plain name is quoted (exporters write symbols such as
    "floor(height/2 - 1/2) + 1"), so that the IR parser reads the text back."""
    if d is None:
        return "?"
    if isinstance(d, ShapeExpr):
        if not quote:
            text = d.__dict__.get("_text")
            if text is not None:
                return text
        sym = BINARY_OPS[d.op]
        lhs, rhs = format_dim(d.lhs, quote), format_dim(d.rhs, quote)
        return f"{sym}({lhs}, {rhs})" if sym.isalpha() else f"({lhs} {sym} {rhs})"
    if quote and isinstance(d, str) and not PLAIN_NAME.fullmatch(d):
        return json.dumps(d)
    return str(d)


def dim_symbols(d: Dim) -> list[str]:
    """Symbol names a dim mentions, in order of first occurrence (with repeats)."""
    if isinstance(d, str):
        return [d]
    if isinstance(d, ShapeExpr):
        return d.symbols()
    return []


def format_shape(shape: tuple[Dim, ...] | None, quote: bool = False) -> str:
    if shape is None:
        return "[*]"
    return "[" + ", ".join(format_dim(d, quote) for d in shape) + "]"
