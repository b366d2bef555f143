"""Builds Graphs from name-based descriptions (ONNX protos, MCP-IR tables), resolving scopes."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import InvalidModelError
from .graph import Attribute, Graph, Node, Value


class GraphBuilder:
    """Resolves value names into Values as a graph is read in source order.

    A subgraph's builder has its graph's builder as parent: names it does not define are looked up
    in the enclosing graphs (ONNX outer-scope references), but only among values defined *before*
    the node that owns the subgraph, as ONNX requires.
    """

    def __init__(self, name: str, parent: GraphBuilder | None = None, *, where: str = "graph") -> None:
        self.graph = Graph(name)
        self.parent = parent
        self.where = where
        self.scope: dict[str, Value] = {}
        self.depth = 0 if parent is None else parent.depth + 1

    def _define(self, v: Value) -> None:
        if not v.name:
            return
        if v.name in self.scope:
            raise InvalidModelError(None, f"{self.where}: value name {v.name!r} is defined twice")
        self.scope[v.name] = v

    def lookup(self, name: str) -> Value | None:
        b: GraphBuilder | None = self
        while b is not None:
            v = b.scope.get(name)
            if v is not None:
                return v
            b = b.parent
        return None

    def add_input(self, v: Value) -> None:
        self._define(v)
        self.graph.inputs.append(v)

    def add_initializer(self, v: Value, *, sparse: bool = False) -> None:
        table = self.graph.sparse_initializers if sparse else self.graph.initializers
        if v.name in table:
            raise InvalidModelError(None, f"{self.where}: initializer {v.name!r} is defined twice")
        existing = self.scope.get(v.name)
        if existing is not None and existing in self.graph.inputs and existing.const is None:
            # IR < 4 style: an initializer that is also listed as a graph input (its default).
            existing.const = v.const
            table[v.name] = existing
            return
        self._define(v)
        table[v.name] = v

    def add_node(self, op_type: str, domain: str, name: str, inputs: Iterable[str],
                 outputs: Iterable[str], attributes: Iterable[Attribute], *, overload: str = "",
                 doc_string: str = "", metadata_props: dict[str, str] | None = None) -> Node:
        resolved = []
        scope = self.scope
        for i in inputs:
            if i == "":
                resolved.append(None)
                continue
            v = scope.get(i) or self.lookup(i)
            if v is None:
                raise InvalidModelError(
                    None, f"{self.where}: node {name or op_type!r} ({op_type}) uses undefined value {i!r}")
            resolved.append(v)
        outs = [Value(o) for o in outputs]
        node = Node(op_type, resolved, outs, domain=domain, name=name, overload=overload,
                    attributes=attributes)
        node.doc_string = doc_string
        if metadata_props:
            node.metadata_props = dict(metadata_props)
        for o in outs:
            self._define(o)
        self.graph.nodes.append(node)
        return node

    def add_output(self, name: str) -> Value:
        v = self.lookup(name) if name else None
        if v is None:
            raise InvalidModelError(None, f"{self.where}: graph output {name!r} is not defined")
        self.graph.outputs.append(v)
        return v

    def add_value_info(self, name: str) -> Value:
        """The value a value_info entry annotates; a name not defined here gets a loose Value."""
        v = self.scope.get(name)
        if v is None or name in self.graph.value_info:
            v = Value(name)
        self.graph.value_info[name] = v
        return v

    def child(self, name: str, attr: str, node_name: str) -> GraphBuilder:
        return GraphBuilder(name, self, where=f"{self.where}/{node_name}.{attr}")
