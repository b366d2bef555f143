"""The in-memory IR: values with use lists, nodes, graphs, functions and the model."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .tensor import SparseTensor, Tensor
from .types import Type


class Layout(enum.IntEnum):
    """Tensor layout contract of a value (numbering = the schema's `Layout`)."""

    NONE = 0
    NCHW = 1
    NHWC = 2
    NCW = 3
    NWC = 4
    NCDHW = 5
    NDHWC = 6


class AttrType(enum.IntEnum):
    """ONNX AttributeProto.AttributeType numbering."""

    UNDEFINED = 0
    FLOAT = 1
    INT = 2
    STRING = 3
    TENSOR = 4
    GRAPH = 5
    FLOATS = 6
    INTS = 7
    STRINGS = 8
    TENSORS = 9
    GRAPHS = 10
    SPARSE_TENSOR = 11
    SPARSE_TENSORS = 12
    TYPE_PROTO = 13
    TYPE_PROTOS = 14


_HOLDS_GRAPHS = (AttrType.GRAPH, AttrType.GRAPHS)   # (a tuple: an Enum member hashes in Python)


@dataclass
class Attribute:
    """A node attribute. `value` is float, int, bytes, Tensor, Graph, SparseTensor, Type or a list.

    Inside a function body an attribute may instead refer to the caller's (`ref_attr_name`).
    """

    name: str
    type: AttrType
    value: Any = None
    ref_attr_name: str = ""
    doc_string: str = ""


class Value:
    """A named value: graph input, node output or constant (initializer), with its uses."""

    __slots__ = ("name", "type", "layout", "producer", "output_index", "uses", "const",
                 "doc_string", "metadata_props")

    def __init__(self, name: str, type: Type | None = None, *, layout: Layout = Layout.NONE,
                 const: Tensor | SparseTensor | None = None) -> None:
        self.name = name
        self.type = type
        self.layout = layout
        self.producer: Node | None = None
        self.output_index = -1
        self.uses: list[tuple[Node, int]] = []   # (consumer, input index)
        self.const = const
        self.doc_string = ""
        self.metadata_props: dict[str, str] = {}

    def replace_all_uses_with(self, other: Value) -> int:
        """Point every consumer of this value at `other`; returns how many inputs changed."""
        uses = list(self.uses)
        for node, index in uses:
            node.set_input(index, other)
        return len(uses)

    def __repr__(self) -> str:
        return f"Value({self.name!r})"


class Node:
    """One operator application. Inputs are Values (None for an omitted optional input)."""

    __slots__ = ("op_type", "domain", "name", "overload", "_inputs", "outputs", "attributes",
                 "doc_string", "metadata_props")

    def __init__(self, op_type: str, inputs: Sequence[Value | None], outputs: Sequence[Value], *,
                 domain: str = "", name: str = "", overload: str = "",
                 attributes: Iterable[Attribute] = ()) -> None:
        self.op_type = op_type
        self.domain = domain
        self.name = name
        self.overload = overload
        self.attributes: dict[str, Attribute] = {a.name: a for a in attributes}
        self.doc_string = ""
        self.metadata_props: dict[str, str] = {}
        self._inputs: list[Value | None] = []
        for v in inputs:
            self._append_input(v)
        self.outputs: list[Value] = list(outputs)
        for i, v in enumerate(self.outputs):
            if v.producer is not None:
                raise ValueError(f"value {v.name!r} already has a producer")
            v.producer, v.output_index = self, i

    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    def _append_input(self, v: Value | None) -> None:
        if v is not None:
            v.uses.append((self, len(self._inputs)))
        self._inputs.append(v)

    def set_input(self, index: int, v: Value | None) -> None:
        """Replace input `index`, keeping both values' use lists right."""
        old = self._inputs[index]
        if old is not None:
            old.uses.remove((self, index))
        if v is not None:
            v.uses.append((self, index))
        self._inputs[index] = v

    def detach(self) -> None:
        """Drop this node's edges: its inputs' uses of it, and its outputs' link to it (the
        outputs must be unused). The graph's node list is updated by Graph.remove_nodes."""
        for o in self.outputs:
            if o.uses:
                raise ValueError(f"cannot remove {self!r}: output {o.name!r} still has uses")
            o.producer = None
        for i in range(len(self._inputs)):
            self.set_input(i, None)

    def is_onnx(self, *op_types: str) -> bool:
        """In the default (ai.onnx) domain, and (when given) one of `op_types`."""
        return self.domain in ("", "ai.onnx") and (not op_types or self.op_type in op_types)

    def subgraphs(self) -> list[Graph]:
        """The graphs its attributes hold (If branches, Loop/Scan bodies): most nodes none."""
        out = []
        for a in self.attributes.values():
            if a.type in _HOLDS_GRAPHS:
                if a.type == AttrType.GRAPH:
                    out.append(a.value)
                else:
                    out.extend(a.value)
        return out

    def __repr__(self) -> str:
        return f"Node({self.op_type}, {self.name!r})"


def unlink(nodes: Iterable[Node]) -> None:
    """Drop the edges of `nodes` at once: their inputs' uses of them and their outputs' link to
    them. Their outputs may be used only by one another."""
    dead = {id(n): n for n in nodes}
    touched: dict[int, Value] = {}
    for n in dead.values():
        for o in n.outputs:
            if o.producer is n:
                if any(id(u) not in dead for u, _ in o.uses):
                    raise ValueError(f"cannot remove {n!r}: output {o.name!r} still has uses")
                o.producer = None
        for v in n._inputs:
            if v is not None:
                touched[id(v)] = v
        n._inputs = [None] * len(n._inputs)
    for v in touched.values():
        v.uses = [(u, i) for u, i in v.uses if id(u) not in dead]


class Graph:
    """A graph: inputs, outputs, constants and nodes in topological order."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}         # values whose `const` is a Tensor
        self.sparse_initializers: dict[str, Value] = {}  # values whose `const` is a SparseTensor
        self.nodes: list[Node] = []
        # Values with a stated type that are neither inputs, outputs nor constants, in source order.
        self.value_info: dict[str, Value] = {}
        self.doc_string = ""
        self.metadata_props: dict[str, str] = {}

    def remove_nodes(self, nodes: Iterable[Node]) -> int:
        """Drop nodes whose outputs nothing else uses, in one pass over the node list and one
        over each input's use list (linear: removing one at a time is quadratic when many nodes
        share an input, such as a constant 6 used by every hard-swish). Nodes already detached
        are fine."""
        dead = {id(n): n for n in nodes}
        unlink(dead.values())
        if dead:
            self.nodes = [n for n in self.nodes if id(n) not in dead]
        return len(dead)

    def remove_node(self, node: Node) -> None:
        """Drop one node (use remove_nodes for many)."""
        self.remove_nodes([node])

    def walk(self) -> Iterator[Node]:
        """Every node of this graph and its subgraphs, depth first."""
        for n in self.nodes:
            yield n
            if n.attributes:   # (most nodes have none)
                for a in n.attributes.values():
                    if a.type in _HOLDS_GRAPHS:
                        for g in ([a.value] if a.type == AttrType.GRAPH else a.value):
                            yield from g.walk()

    def graphs(self) -> Iterator[Graph]:
        """This graph and every subgraph. (Asked for by most passes, several times each: the
        attributes are looked at here, not through a generator per node, 4x faster.)"""
        yield self
        for n in self.nodes:
            if n.attributes:
                for a in n.attributes.values():
                    if a.type in _HOLDS_GRAPHS:
                        for g in ([a.value] if a.type == AttrType.GRAPH else a.value):
                            yield from g.graphs()


@dataclass
class Function:
    """A model-local function (ONNX FunctionProto); its body is a Graph without types."""

    name: str
    domain: str
    body: Graph
    attributes: list[str] = field(default_factory=list)
    attribute_defaults: list[Attribute] = field(default_factory=list)
    opset_imports: dict[str, int] = field(default_factory=dict)
    overload: str = ""
    doc_string: str = ""
    metadata_props: dict[str, str] = field(default_factory=dict)


@dataclass
class Model:
    graph: Graph
    opset_imports: dict[str, int] = field(default_factory=dict)
    ir_version: int = 10
    producer_name: str = ""
    producer_version: str = ""
    domain: str = ""
    model_version: int = 0
    doc_string: str = ""
    functions: list[Function] = field(default_factory=list)
    metadata_props: dict[str, str] = field(default_factory=dict)
    # symbols of the interface that shape inference found an op needs equal to one constant (a
    # MatMul's feature size): a target may declare that size (not stored in the .mcpir)
    shape_ties: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def onnx_opset(self) -> int:
        """The ai.onnx opset the model imports (as "" or "ai.onnx"; 1 when it imports none)."""
        return self.opset_imports.get("", self.opset_imports.get("ai.onnx", 1))

    def all_graphs(self) -> Iterator[Graph]:
        yield from self.graph.graphs()
        for f in self.functions:
            yield from f.body.graphs()

    def tensors(self) -> Iterator[Tensor]:
        """Every constant tensor of the model: initializers and tensor-valued attributes."""
        for g in self.all_graphs():
            for v in g.initializers.values():
                yield v.const
            for v in g.sparse_initializers.values():
                yield v.const.values
                yield v.const.indices
            for n in g.nodes:
                for a in n.attributes.values():
                    yield from _attr_tensors(a)
        for f in self.functions:
            for a in f.attribute_defaults:
                yield from _attr_tensors(a)


def _attr_tensors(a: Attribute) -> Iterator[Tensor]:
    if a.type == AttrType.TENSOR:
        yield a.value
    elif a.type == AttrType.TENSORS:
        yield from a.value
    elif a.type == AttrType.SPARSE_TENSOR:
        yield a.value.values
        yield a.value.indices
    elif a.type == AttrType.SPARSE_TENSORS:
        for s in a.value:
            yield s.values
            yield s.indices
