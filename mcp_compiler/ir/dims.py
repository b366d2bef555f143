"""Symbolic dimensions: a dim is an int, a symbol name, a ShapeExpr over symbols, or None (unknown)."""

from __future__ import annotations

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

    def __str__(self) -> str:
        sym = BINARY_OPS[self.op]
        if sym.isalpha():
            return f"{sym}({_fmt(self.lhs)}, {_fmt(self.rhs)})"
        return f"({_fmt(self.lhs)} {sym} {_fmt(self.rhs)})"


Dim = Union[int, str, ShapeExpr, None]


def _fmt(d: Dim) -> str:
    return "?" if d is None else str(d)


def dim_symbols(d: Dim) -> list[str]:
    """Symbol names a dim mentions, in order of first occurrence (with repeats)."""
    if isinstance(d, str):
        return [d]
    if isinstance(d, ShapeExpr):
        return d.symbols()
    return []


def format_shape(shape: tuple[Dim, ...] | None) -> str:
    if shape is None:
        return "[*]"
    return "[" + ", ".join(_fmt(d) for d in shape) + "]"
