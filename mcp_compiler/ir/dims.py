"""Symbolic dimensions: a dim is an int, a symbol name, a ShapeExpr over symbols, or None (unknown)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Union

# The Python spelling of each ShapeExpr operator, also used to print expressions.
BINARY_OPS = {"add": "+", "sub": "-", "mul": "*", "floor_div": "//", "ceil_div": "/^", "mod": "%",
              "max": "max", "min": "min"}


@dataclass(frozen=True, eq=False)
class ShapeExpr:
    """A binary expression over dims, e.g. ShapeExpr("floor_div", "H", 32) for H // 32.

    Expressions share their operands (a DAG), so everything asked of one is worked out once, at
    construction, from its operands' answers: its size (nodes of the written-out tree), its hash
    and its symbols. Nothing walks the tree again, whatever it grew to; shape inference bounds
    the size (passes/shapes/symbolic_shapes.py, EXPR_LIMIT)."""

    op: str
    lhs: Dim
    rhs: Dim

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise ValueError(f"unknown ShapeExpr op {self.op!r}")
        if self.lhs is None or self.rhs is None:
            raise ValueError("ShapeExpr operands must be known dims")
        put = object.__setattr__
        put(self, "_size", 1 + dim_size(self.lhs) + dim_size(self.rhs))
        put(self, "_hash", hash((self.op, self.lhs, self.rhs)))   # the operands' hashes are cached
        syms = dim_symbols(self.lhs)
        more = [x for x in dim_symbols(self.rhs) if x not in syms]
        put(self, "_syms", syms + more if more else syms)

    def __hash__(self) -> int:
        return self.__dict__["_hash"]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ShapeExpr):
            return NotImplemented
        return (self.__dict__["_hash"] == other.__dict__["_hash"] and self.op == other.op
                and self.lhs == other.lhs and self.rhs == other.rhs)

    def symbols(self) -> list[str]:
        return list(self.__dict__["_syms"])

    def __str__(self) -> str:   # the text is kept: shape algebra orders and keys terms by it
        text = self.__dict__.get("_text")
        if text is None:
            text = format_dim(self)
            object.__setattr__(self, "_text", text)
        return text


def dim_size(d: Dim) -> int:
    """How many nodes the dim's expression tree has written out (1 for a symbol or an int)."""
    return d.__dict__["_size"] if isinstance(d, ShapeExpr) else 1


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
    """Symbol names a dim mentions, each once, in order of first occurrence."""
    if isinstance(d, str):
        return [d]
    if isinstance(d, ShapeExpr):
        return list(d.__dict__["_syms"])
    return []


def format_shape(shape: tuple[Dim, ...] | None, quote: bool = False) -> str:
    if shape is None:
        return "[*]"
    return "[" + ", ".join(format_dim(d, quote) for d in shape) + "]"
