"""The in-memory IR that passes work on."""

from .dims import Dim, ShapeExpr, format_shape
from .graph import Attribute, AttrType, Function, Graph, Layout, Model, Node, Value
from .tensor import SparseTensor, Tensor
from .types import DataType, MapType, NoType, OptionalType, SequenceType, TensorType, Type

__all__ = ["AttrType", "Attribute", "DataType", "Dim", "Function", "Graph", "Layout", "MapType",
           "Model", "NoType", "Node", "OptionalType", "SequenceType", "ShapeExpr", "SparseTensor",
           "Tensor", "TensorType", "Type", "Value", "format_shape"]
