"""Merge nodes that compute the same thing."""

from __future__ import annotations

from mcp_compiler.ir import AttrType, Model, Node

from .._infra import ALL, Pass, PassContext, PassResult

# Ops whose results differ between two calls with the same inputs.
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                     "Multinomial", "Bernoulli", "Dropout"}


class CommonSubexpressionEliminationPass(Pass):
    """op(a, b; attrs) twice -> once: a node with the same op, domain, inputs (the same values)
    and attributes as an earlier node in the same graph is replaced by that node's outputs.

    Not applied to random ops, to nodes with subgraph or tensor attributes, or where a duplicate's
    output is a graph output.
    """

    name = "common-subexpression-elimination"
    requires = frozenset()
    establishes = frozenset()
    preserves = ALL
    idempotent = True

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        merged = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            seen: dict[tuple, Node] = {}
            done = []
            for n in g.nodes:
                key = _key(n)
                if key is None:
                    continue
                first = seen.get(key)
                if first is None:
                    seen[key] = n
                    continue
                if any(id(o) in outputs for o in n.outputs):
                    continue
                for mine, theirs in zip(n.outputs, first.outputs):
                    mine.replace_all_uses_with(theirs)
                n.detach()
                done.append(n)
                merged += 1
            g.remove_nodes(done)
        return PassResult(model, merged > 0, {"nodes_merged": merged})


# Attribute kinds a key cannot hold (a subgraph, a tensor: compared by identity they would never match).
_UNKEYED = frozenset({AttrType.GRAPH, AttrType.GRAPHS, AttrType.TENSOR, AttrType.TENSORS, AttrType.SPARSE_TENSOR,
                      AttrType.SPARSE_TENSORS, AttrType.TYPE_PROTO, AttrType.TYPE_PROTOS})


def _key(n: Node) -> tuple | None:
    if n.op_type in _NONDETERMINISTIC:
        return None
    ins = tuple([None if v is None else id(v) for v in n._inputs])
    if not n.attributes:   # (most nodes)
        return (n.op_type, n.domain, n.overload, len(n.outputs), ins, ())
    attrs = []
    for a in n.attributes.values():
        if a.type in _UNKEYED or a.ref_attr_name:
            return None
        v = tuple(a.value) if isinstance(a.value, list) else a.value
        attrs.append((a.name, int(a.type), v))
    return (n.op_type, n.domain, n.overload, len(n.outputs), ins, tuple(sorted(attrs)))
