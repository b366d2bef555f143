"""Shape analysis: symbolic shape inference into the IR's ShapeExpr dims."""

from .symbolic_shapes import SymbolicShapesPass

__all__ = ["SymbolicShapesPass"]
