"""Patterns over the IR, so that a fusion rule reads as the algebra it replaces."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from mcp_compiler.ir import Node, Value

from . import _rewrite as R

# Binary ops whose operands may come in either order.
_COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal"}


class Pattern:
    """Base of the pattern classes: `Var`, `Const`, `Op`, `Or`."""


@dataclass(frozen=True)
class Var(Pattern):
    """Any value; every occurrence of one name must be the same value."""

    name: str
    where: Callable[[Value], bool] | None = None


@dataclass(frozen=True)
class Const(Pattern):
    """A constant with one element: near `value` (relative 1e-6) when given; bound as `name`."""

    value: float | None = None
    name: str | None = None


@dataclass(frozen=True)
class Or(Pattern):
    """The first of the alternatives that matches (later ones are tried on backtracking)."""

    alternatives: tuple[Pattern, ...]

    def __init__(self, *alternatives: Pattern) -> None:
        object.__setattr__(self, "alternatives", alternatives)


@dataclass(frozen=True)
class Op(Pattern):
    """A node of the ai.onnx domain whose output 0 is the value, with its inputs matching.

    `name` binds the node (a second occurrence must be the same node: a value used twice in
    the algebra); `where(node)` checks attributes; `more_inputs` allows inputs past those given
    (ReduceMean's axes input at opset 18+). Add, Mul, Max, Min, ... try both operand orders.
    """

    op_type: str
    inputs: tuple[Pattern, ...]
    name: str | None = None
    where: Callable[[Node], bool] | None = None
    more_inputs: bool = False

    def __init__(self, op_type: str, *inputs: Pattern, name: str | None = None,
                 where: Callable[[Node], bool] | None = None, more_inputs: bool = False) -> None:
        for k, v in (("op_type", op_type), ("inputs", inputs), ("name", name), ("where", where),
                     ("more_inputs", more_inputs)):
            object.__setattr__(self, k, v)


@dataclass
class Match:
    """What a pattern bound: values and nodes by name, and the matched nodes (the root last)."""

    bound: dict[str, Value | Node]
    nodes: list[Node]
    constants: list[np.ndarray] = field(default_factory=list)

    def __getitem__(self, name: str) -> Value:
        v = self.bound[name]
        assert isinstance(v, Value), name
        return v

    def node(self, name: str) -> Node:
        n = self.bound[name]
        assert isinstance(n, Node), name
        return n

    def scalar(self, name: str) -> float:
        return R.scalar(self[name])

    def broadcasts_like(self, x: Value) -> bool:
        """Every matched constant broadcasts against x without adding dims, so f(x)'s shape
        is x's: its rank is at most x's (0 when x's rank is unknown)."""
        rank = len(R.shape(x) or ())
        return all(a.ndim <= rank for a in self.constants)


@dataclass
class _State:
    bound: dict[str, Value | Node]
    nodes: tuple[Node, ...]
    constants: tuple[np.ndarray, ...]


def match(pattern: Pattern, root: Node, outputs: set[int]) -> Match | None:
    """Match `pattern` at `root` (the node making the pattern's result; `Op` or `Or` of `Op`).

    Every value made inside the pattern, but for the root's, must be used only by the
    pattern's nodes and not be a graph output (`outputs`: ids of the graph's outputs), so
    that replacing the pattern loses nothing.
    """
    if not root.outputs or not _may_match(pattern, root):
        return None
    for s in _match(pattern, root.outputs[0], _State({}, (), ())):
        if not s.nodes or s.nodes[0] is not root:
            continue
        inside = {id(n) for n in s.nodes}
        if all(id(o) not in outputs and all(id(u) in inside for u, _ in o.uses)
               for n in s.nodes if n is not root for o in n.outputs):
            unique = {id(n): n for n in s.nodes if n is not root}
            nodes = [*unique.values(), root]
            return Match(dict(s.bound), nodes, list(s.constants))
    return None


def possible(p: Pattern, ops: set[str]) -> bool:
    """False when `p` cannot match anywhere in a graph whose nodes' op types are among `ops`:
    an Op it needs (in every alternative) is not there."""
    if isinstance(p, Op):
        return p.op_type in ops and all(possible(q, ops) for q in p.inputs)
    if isinstance(p, Or):
        return any(possible(a, ops) for a in p.alternatives)
    return True


def _may_match(p: Pattern, n: Node) -> bool:
    """A quick look one level deep (the root's op and its operands' producers): False when the
    pattern cannot match at n, so that the full match runs only where it may (most sites of a
    common op such as Mul or Add are no candidate for any fusion)."""
    if isinstance(p, Or):
        return any(_may_match(a, n) for a in p.alternatives)
    if not isinstance(p, Op) or n.op_type != p.op_type:
        return False
    ins = n._inputs
    if len(ins) < len(p.inputs):
        return False
    if p.op_type in _COMMUTATIVE and len(p.inputs) == 2 and len(ins) == 2:
        a, b = p.inputs
        return (_may_be(a, ins[0]) and _may_be(b, ins[1])) or (_may_be(b, ins[0]) and _may_be(a, ins[1]))
    return all(_may_be(q, v) for q, v in zip(p.inputs, ins))


def _may_be(p: Pattern, v: Value | None) -> bool:
    if v is None:
        return False
    if isinstance(p, Op):
        n = v.producer
        return n is not None and n.op_type == p.op_type
    if isinstance(p, Or):
        return any(_may_be(a, v) for a in p.alternatives)
    if isinstance(p, Const):
        return v.const is not None
    return True


def _failure(fails: list[tuple[int, str]] | None, s: _State, at: str) -> Callable[[str], None]:
    """What records why a try at `at` failed (nothing when no one asks), with its depth."""
    if fails is None:
        return lambda why: None
    return lambda why: fails.append((len(s.nodes), f"{at} {why}"))


def _match(p: Pattern, v: Value | None, s: _State, at: str = "the root",
           fails: list[tuple[int, str]] | None = None) -> Iterator[_State]:
    """The states in which `p` matches `v`; `fails` (when given) collects why each failed try
    did not match, with how many nodes had matched by then (the deepest is the one to report)."""
    fail = _failure(fails, s, at)
    if v is None:
        fail("is omitted")
        return
    if isinstance(p, Var):
        seen = s.bound.get(p.name)
        if seen is v:
            yield s
        elif seen is not None:
            fail(f"is not the same value as {p.name} elsewhere in the pattern")
        elif p.where is not None and not p.where(v):
            fail(f"({v.name}) fails {p.name}'s condition")
        else:
            yield _State({**s.bound, p.name: v}, s.nodes, s.constants)
    elif isinstance(p, Const):
        a = R.const(v)
        if a is None or a.size != 1:
            fail(f"({v.name}) is not a constant with one element")
            return
        got = float(a.reshape(-1)[0])
        if p.value is not None and not _near(got, p.value):
            fail(f"is the constant {got:g}, not {p.value:g}")
            return
        bound = {**s.bound, p.name: v} if p.name else s.bound
        yield _State(bound, s.nodes, s.constants + (a,))
    elif isinstance(p, Or):
        for alt in p.alternatives:
            yield from _match(alt, v, s, at, fails)
    elif isinstance(p, Op):
        yield from _match_op(p, v, s, at, fails)
    else:
        raise TypeError(f"not a pattern: {p!r}")


def _match_op(p: Op, v: Value, s: _State, at: str, fails: list | None) -> Iterator[_State]:
    fail = _failure(fails, s, at)
    n = v.producer
    if n is None:
        fail(f"({v.name}) is a graph input or a constant, not {p.op_type}'s result")
        return
    if n.op_type != p.op_type or not n.is_onnx():
        fail(f"({v.name}) is made by {n.op_type}, not {p.op_type}")
        return
    if v.output_index != 0:
        fail(f"({v.name}) is {p.op_type}'s output {v.output_index}, not its output 0")
        return
    if p.name is not None and p.name in s.bound:
        if s.bound[p.name] is n:
            yield s
        else:
            fail(f"is another {p.op_type} than {p.name} elsewhere in the pattern")
        return
    ins = n.inputs
    if len(ins) < len(p.inputs) or (len(ins) > len(p.inputs) and not p.more_inputs):
        fail(f"{p.op_type} has {len(ins)} inputs, not {len(p.inputs)}")
        return
    if p.where is not None and not p.where(n):
        fail(f"{p.op_type} ({n.name or v.name}) fails its attribute check")
        return
    bound = {**s.bound, p.name: n} if p.name else s.bound
    start = _State(bound, s.nodes + (n,), s.constants)
    orders = [p.inputs]
    if p.op_type in _COMMUTATIVE and len(p.inputs) == 2 and len(ins) == 2:
        orders.append(p.inputs[::-1])
    for order in orders:
        yield from _match_inputs(order, ins, 0, start, p.op_type, fails)


def _match_inputs(pats: tuple[Pattern, ...], ins: tuple[Value | None, ...], i: int,
                  s: _State, op: str, fails: list | None) -> Iterator[_State]:
    if i == len(pats):
        yield s
        return
    for s2 in _match(pats[i], ins[i], s, f"input {i} of {op}", fails):
        yield from _match_inputs(pats, ins, i + 1, s2, op, fails)


def _near(v: float, want: float) -> bool:
    return abs(v - want) <= 1e-6 * max(abs(want), 1e-30) or v == want


def why_not(pattern: Pattern, root: Node, outputs: set[int]) -> str:
    """Why `match(pattern, root, outputs)` found nothing, in words (for --explain-pass): the
    sub-pattern that failed deepest into the pattern, or the value that escapes it."""
    if not root.outputs:
        return "the node has no outputs"
    fails: list[tuple[int, str]] = []
    states = [st for st in _match(pattern, root.outputs[0], _State({}, (), ()), fails=fails)
              if st.nodes and st.nodes[0] is root]
    if not states:
        if not fails:
            return "its operands are not the pattern's"
        depth = max(d for d, _ in fails)
        return next(why for d, why in fails if d == depth)
    for st in states:
        inside = {id(n) for n in st.nodes}
        for n in st.nodes:
            for o in n.outputs if n is not root else ():
                if id(o) in outputs:
                    return f"{o.name} (made by {n.op_type} inside the pattern) is a graph output"
                users = [u for u, _ in o.uses if id(u) not in inside]
                if users:
                    return f"{o.name} (made by {n.op_type} inside the pattern) is also used by {users[0].op_type}" \
                           f" {users[0].name or ''}".rstrip()
    return "a value inside the pattern is used elsewhere or is a graph output"
