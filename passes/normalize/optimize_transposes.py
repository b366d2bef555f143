"""Transposes move down through elementwise ops, and merge or cancel where they meet."""

from __future__ import annotations

from mcp_compiler.ir import Attribute, AttrType, Graph, Model, Node

from .. import _rewrite as R
from .._infra import REWRITES, Pass, PassContext, PassResult
from ..layout.to_nhwc import BINARY, UNARY, is_transpose, perm_of, swap_below, toposort, transposed_back


class OptimizeTransposesPass(Pass):
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

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        g = model.graph
        s = _Sweep(g)
        s.run()
        if s.changed:
            g.remove_nodes(s.dead)
            toposort(g)
        return PassResult(model, s.changed, {"moved": s.moved, "merged": s.merged, "cancelled": s.cancelled})


class _Sweep:
    def __init__(self, g: Graph) -> None:
        self.g, self.outputs = g, {id(v) for v in g.outputs}
        self.dead: list[Node] = []
        self.gone: set[int] = set()
        self.names: set[str] | None = None
        self.moved = self.merged = self.cancelled = 0

    @property
    def changed(self) -> bool:
        return bool(self.moved or self.merged or self.cancelled)

    def run(self) -> None:
        work = [n for n in self.g.nodes if is_transpose(n)]
        steps = 0
        while work and steps < 20 * len(self.g.nodes) + 100:
            steps += 1
            t = work.pop()
            y = t.outputs[0]
            if id(t) in self.gone or t.inputs[0] is None or perm_of(t) is None or id(y) in self.outputs \
                    or len(y.uses) != 1:
                continue
            n, index = y.uses[0]
            if is_transpose(n) and perm_of(n) is not None:
                work += self._merge(t, n)
            elif self._movable(t, n, index):
                swap_below(t, n, self._names())
                self.moved += 1
                work.append(t)

    def _names(self) -> set[str]:
        if self.names is None:
            self.names = R.value_names(self.g)
        return self.names

    def _kill(self, n: Node) -> None:
        self.dead.append(n)
        self.gone.add(id(n))

    def _merge(self, t: Node, n: Node) -> list[Node]:
        composed = [perm_of(t)[p] for p in perm_of(n)]
        x = t.inputs[0]
        if composed == sorted(composed) and id(n.outputs[0]) not in self.outputs:
            n.outputs[0].replace_all_uses_with(x)
            t.set_input(0, None)
            n.set_input(0, None)
            self._kill(t)
            self._kill(n)
            self.cancelled += 2
            return []
        n.set_input(0, x)
        n.attributes["perm"] = Attribute("perm", AttrType.INTS, composed)
        t.set_input(0, None)
        self._kill(t)
        self.merged += 1
        return [n]

    def _movable(self, t: Node, n: Node, index: int) -> bool:
        """Whether t may move below n; prepares n's other operand when it does."""
        if not n.is_onnx() or len(n.outputs) != 1 or id(n.outputs[0]) in self.outputs:
            return False
        if n.op_type in UNARY:
            return index == 0 and all(v is None or R.const(v) is not None for v in n.inputs[1:])
        if n.op_type not in BINARY or len(n.inputs) != 2:
            return False
        other = n.inputs[1 - index]
        p = other.producer if other is not None else None
        if is_transpose(p, perm_of(t)) and len(other.uses) == 1 and id(other) not in self.outputs \
                and p.inputs[0] is not None:
            n.set_input(1 - index, p.inputs[0])   # b(T(x), T(y)) -> b(x, y), transposed once below
            p.set_input(0, None)
            self._kill(p)
            self.merged += 1
            return True
        return self._constant_operand(n, 1 - index, perm_of(t))

    def _constant_operand(self, n: Node, j: int, perm: list[int]) -> bool:
        v = n.inputs[j]
        a = R.const(v)
        if a is None or a.ndim > len(perm):
            return False
        if a.size == 1:
            return True
        if len(v.uses) != 1 or id(v) in self.outputs:
            return False   # a shared constant would be copied: the weights would grow
        n.set_input(j, R.new_constant(self.g, self._names(), f"{v.name}__t", transposed_back(a, perm)))
        return True
