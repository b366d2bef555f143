"""Transposes move down through elementwise ops, and merge or cancel where they meet."""

from __future__ import annotations

from mcp_compiler.ir import Attribute, AttrType, Node

from .. import _rewrite as R
from .._infra import REWRITES
from .._rules import FnRule, RewriteContext, RuleSetPass
from ..layout.to_nhwc import BINARY, UNARY, is_transpose, perm_of, swap_below, transposed_back


class OptimizeTransposesPass(RuleSetPass):
    """Rules (main graph; a transpose whose result has one use and is not a graph output):

    - T(T(x, p), q) -> T(x, p∘q), or x when p∘q is the identity
    - u(T(x, p)) -> T(u(x), p) for an elementwise u (Relu, Sigmoid, Cast, Clip, ...)
    - b(T(x, p), T(y, p)) -> T(b(x, y), p) for an elementwise binary b (Add, Mul, ...): one
      transpose instead of two
    - b(T(x, p), c) -> T(b(x, c'), p) for a constant c with one element, or one used only here
      (then c' is c transposed back, replacing it)

    so that the transposes exporters write around layout-sensitive ops (tf2onnx's NHWC <-> NCHW
    pairs around every Conv) meet and cancel. Never adds a node or grows the weights. Exact.
    """

    name = "optimize-transposes"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES
    main_graph_only = True


def _site(t: Node, rc: RewriteContext):  # noqa: ANN202
    """t's single consumer n, and its input index, when t may merge or move; else why not."""
    y = t.outputs[0] if t.outputs else None
    if not is_transpose(t) or t.inputs[0] is None or perm_of(t) is None:
        return "not a Transpose with a perm"
    if rc.is_output(y) or len(y.uses) != 1:
        return f"{y.name} is a graph output or has more than one use"
    return y.uses[0]


def _meets(t: Node, rc: RewriteContext):  # noqa: ANN202
    site = _site(t, rc)
    if isinstance(site, str):
        return site
    n, _ = site
    return n if is_transpose(n) and perm_of(n) is not None else "its user is not a Transpose"


def _composed(t: Node, n: Node) -> list[int]:
    return [perm_of(t)[p] for p in perm_of(n)]


def _cancels(t: Node, rc: RewriteContext):  # noqa: ANN202
    n = _meets(t, rc)
    if isinstance(n, str):
        return n
    composed = _composed(t, n)
    if composed != sorted(composed):
        return "the two perms do not compose to the identity"
    return n if not rc.is_output(n.outputs[0]) else "the second Transpose's result is a graph output"


def _cancel(t: Node, n: Node, rc: RewriteContext) -> None:
    rc.replace_value(n.outputs[0], t.inputs[0])
    rc.erase(n)
    rc.erase(t)


def _merge(t: Node, n: Node, rc: RewriteContext) -> None:
    n.attributes["perm"] = Attribute("perm", AttrType.INTS, _composed(t, n))
    rc.set_input(n, 0, t.inputs[0])
    rc.erase(t)


def _movable(t: Node, rc: RewriteContext):  # noqa: ANN202
    """(n, how, j) when t may move below its user n: how "unary", "pair" (n's other operand j is
    the same transpose of another value), "scalar" or "constant" (operand j is a constant, transposed
    back when it has more than one element); else why not."""
    site = _site(t, rc)
    if isinstance(site, str):
        return site
    n, index = site
    if not n.is_onnx() or len(n.outputs) != 1 or rc.is_output(n.outputs[0]):
        return f"its user {n.op_type} is not an ai.onnx op of one output that is not a graph output"
    if n.op_type in UNARY:
        ok = index == 0 and all(v is None or R.const(v) is not None for v in n.inputs[1:])
        return (n, "unary", None) if ok else f"{n.op_type}'s other inputs are not constants"
    if n.op_type not in BINARY or len(n.inputs) != 2:
        return f"its user {n.op_type} is not elementwise"
    j = 1 - index
    other = n.inputs[j]
    p = other.producer if other is not None else None
    if is_transpose(p, perm_of(t)) and len(other.uses) == 1 and not rc.is_output(other) and p.inputs[0] is not None:
        return n, "pair", j
    a = R.const(other)
    if a is None or a.ndim > len(perm_of(t)):
        return f"{n.op_type}'s other operand is neither the same Transpose nor a constant of rank <= {len(perm_of(t))}"
    if a.size == 1:
        return n, "scalar", j
    if len(other.uses) != 1 or rc.is_output(other):
        return f"{n.op_type}'s constant operand is shared: transposing it would grow the weights"
    return n, "constant", j


def _move(t: Node, found, rc: RewriteContext) -> None:  # noqa: ANN001
    n, how, j = found
    if how == "pair":   # b(T(x), T(y)) -> b(x, y), transposed once below
        p = n.inputs[j].producer
        rc.set_input(n, j, p.inputs[0])
        rc.erase(p)
    elif how == "constant":
        v = n.inputs[j]
        rc.set_input(n, j, rc.constant(f"{v.name}__t", transposed_back(R.const(v), perm_of(t))))
    swap_below(t, n, rc.names)
    rc.toposort = True
    rc.changed(t)
    rc.changed(n)


T = frozenset({"Transpose"})
OptimizeTransposesPass.rounds = ((FnRule("cancelled", T, _cancels, _cancel), FnRule("merged", T, _meets, _merge),
                                  FnRule("moved", T, _movable, _move)),)
