"""An If whose condition is a constant becomes the branch it takes."""

from __future__ import annotations

from mcp_compiler.ir import Graph, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES
from .._rules import FnRule, RewriteContext, RuleSetPass


class InlineConstantIfPass(RuleSetPass):
    """Rule: If(c) with c a constant -> the nodes of then_branch (c true) or else_branch, in the
    If's place; the If's results are the branch's results. PyTorch writes such Ifs for a squeeze
    of a dim that may be 1 (`If(Shape(x)[d] == 1, Squeeze, Identity)`): once fold-shape-values
    and fold-constants know the dim, the condition is a constant. Exact: the branch the runtime
    would take. Names stay unique (ONNX forbids a subgraph to shadow an outer name; clashes get
    a suffix anyway).
    """

    name = "inline-constant-if"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES


def _constant_if(n: Node, rc: RewriteContext):  # noqa: ANN202
    if not n.is_onnx():
        return "not an ai.onnx If"
    branch = _taken(n)
    if branch is None:
        return "its condition is not a constant with one element"
    if len(branch.outputs) != len(n.outputs) or branch.inputs:
        return "the branch's outputs do not match the If's"
    return branch


def _taken(n: Node) -> Graph | None:
    c = n.inputs[0] if n.inputs else None
    a = R.const(c)
    if a is None or a.size != 1:
        return None
    attr = n.attributes.get("then_branch" if bool(a.reshape(-1)[0]) else "else_branch")
    return attr.value if attr is not None and isinstance(attr.value, Graph) else None


def _inline(n: Node, branch: Graph, rc: RewriteContext) -> None:
    """The branch's nodes take the If's place; its results are the If's."""
    g, names = rc.graph, rc.names
    for v in list(branch.initializers.values()):
        v.name = R.fresh_name(names, v.name)
        g.initializers[v.name] = v
    for m in branch.nodes:
        for o in m.outputs:
            if o.name and o.name in names:
                o.name = R.fresh_name(names, o.name)
            names.add(o.name)
    new = list(branch.nodes)
    for y, b in zip(n.outputs, branch.outputs):
        if not rc.is_output(y):
            rc.replace_value(y, b)
            continue
        # a graph output keeps its value: the branch's node makes it, or an Identity copies it
        p = b.producer
        if p is not None and any(o is b for o in p.outputs) and not rc.is_output(b):
            R.produce_in_place(b, y)
        else:
            y.producer = None
            new.append(Node("Identity", [b], [y], name=f"{n.name or y.name}_inlined"))
    n.outputs = [Value(f"{n.name or 'if'}__inlined_{i}") for i in range(len(n.outputs))]
    for o in n.outputs:
        o.producer = n
    branch.nodes, branch.outputs, branch.initializers = [], [], {}
    rc.replace([n], new)


InlineConstantIfPass.rounds = ((FnRule("ifs_inlined", frozenset({"If"}), _constant_if, _inline),),)
