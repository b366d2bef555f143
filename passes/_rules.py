"""Local rewrites as rule sets, on one engine (onnxscript's RewriteRule, MLIR's greedy driver).

A rule rewrites at a site: a node of one of its root ops. `Rule` is a pattern, a replacement
and a check that says why a match may not fire; `FnRule` is a rule whose match is code (what a
pattern cannot say: a chain of any length, a pass-through of any op) and whose rewrite edits the
graph through the `RewriteContext`.

The driver (`RuleSetPass.run`) walks each graph once per round of rules: it seeds a worklist
with every node, pops one, tries the rules indexed by its op (the first that matches and passes
its check fires), and pushes what a rewrite touched (the new nodes, their producers and their
users) until nothing fires: a fixed point, found without sweeping the graph again. Nodes a
rewrite makes take the place of the node they replace in the graph's order; the node list is
rebuilt once at the end. Sites where no rule fired keep the reasons, which `--explain-pass NAME`
prints, each naming the sub-pattern that failed; `remaining()` checks the pass's claim that no
rule fires after it ran (`--verify-each`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mcp_compiler.ir import Graph, Model, Node, Value

from . import _rewrite as R
from ._infra import Pass, PassContext, PassResult
from ._pattern import Match, Op, Or, Pattern, match, possible, why_not

# a value used by more nodes than this keeps a dead node's use until the end of the run (dropped
# then, all at once): dropping it at once would cost its whole use list per rewrite
_MANY_USES = 32


class RewriteContext:
    """What a rewrite gets: the graph and model, fresh names and new constants, and the edits,
    each of which tells the driver what to look at again."""

    def __init__(self, model: Model, graph: Graph, push: Callable[[Node], None] | None = None) -> None:
        self.model, self.graph = model, graph
        self.outputs = {id(v) for v in graph.outputs}
        self.toposort = False        # a rule moved nodes: the driver re-sorts the graph at the end
        self.applied = 0             # rewrites made through this context (the driver counts them)
        self.memo: dict[str, Any] = {}   # what rules compute once per graph and run
        self._names: set[str] | None = None
        self._push = push or (lambda n: None)
        self._new: dict[int, list[Node]] = {}   # node -> the nodes that take its place
        self._dead: set[int] = set()
        self._deferred: list[Node] = []         # dead nodes still listed as users of a widely used value

    # names and constants -------------------------------------------------------------------
    @property
    def names(self) -> set[str]:
        """The graph's value names (computed once per run; `constant` keeps it current)."""
        if self._names is None:
            self._names = R.value_names(self.graph)
        return self._names

    def constant(self, base: str, array: np.ndarray) -> Value:
        """A new initializer holding `array`, named `base` or `base_1`, ..."""
        return R.new_constant(self.graph, self.names, base, array)

    def is_output(self, v: Value) -> bool:
        return id(v) in self.outputs

    def only_use(self, v: Value) -> Node | None:
        return R.only_use(v, self.outputs)

    def dead(self, n: Node) -> bool:
        return id(n) in self._dead

    # edits ---------------------------------------------------------------------------------
    def replace(self, nodes: Sequence[Node], new: Sequence[Node]) -> None:
        """`new` takes the place of `nodes` (the last of which made the result; the others are
        used only inside): their outputs must already belong to the new nodes (`free` gives
        them up) or be unused."""
        self._new[id(nodes[-1])] = list(new)
        for n in nodes:
            self._kill(n)
        for m in new:
            self.changed(m)

    def free(self, nodes: Sequence[Node]) -> None:
        """The nodes give up their outputs (for a replacement to make them)."""
        for n in nodes:
            for o in n.outputs:
                o.producer = None
            n.outputs = [Value(f"{n.name or n.op_type}__rewritten")]
            n.outputs[0].producer = n

    def erase(self, n: Node) -> None:
        """Drop a node whose outputs are no longer used."""
        for o in n.outputs:
            if any(not self.dead(u) for u, _ in o.uses):
                raise ValueError(f"cannot erase {n!r}: {o.name} is still used")
        self._kill(n)

    def replace_value(self, old: Value, new: Value) -> None:
        """Every user of `old` reads `new` instead (they are looked at again)."""
        users = [u for u, _ in old.uses]
        old.replace_all_uses_with(new)
        dead = self._dead
        for u in users:
            if id(u) not in dead:
                self.changed(u)
        if new.producer is not None and id(new.producer) not in dead:
            self._push(new.producer)

    def set_input(self, n: Node, i: int, v: Value | None) -> None:
        old = n.inputs[i]
        n.set_input(i, v)
        self.changed(n)
        if old is not None and old.producer is not None and not self.dead(old.producer):
            self._push(old.producer)

    def changed(self, n: Node) -> None:
        """Look at n again, and at its producers and users (what may match now)."""
        push, dead = self._push, self._dead
        push(n)
        for v in n._inputs:
            if v is not None and v.producer is not None and id(v.producer) not in dead:
                push(v.producer)
        for o in n.outputs:
            for u, _ in o.uses:
                if id(u) not in dead:
                    push(u)

    def _kill(self, n: Node) -> None:
        if id(n) in self._dead:
            return
        self._dead.add(id(n))
        for o in n.outputs:
            if o.producer is n:
                o.producer = None
        for i, v in enumerate(n._inputs):
            if v is None:
                continue
            if len(v.uses) > _MANY_USES:
                if not self._deferred or self._deferred[-1] is not n:
                    self._deferred.append(n)
                continue
            v.uses = [(u, j) for u, j in v.uses if u is not n]
            n._inputs[i] = None
            if v.producer is not None and not self.dead(v.producer):
                self._push(v.producer)   # it lost a user: a single-use rule may fire now

    def finish(self) -> bool:
        """The graph's node list with the rewrites in place (re-sorted when a rule moved nodes);
        whether anything changed."""
        if self._new or self._dead:
            self._rebuild()
        if self.toposort:   # a rule rewired nodes out of order (a transpose moved below its user)
            from .layout.to_nhwc import toposort

            toposort(self.graph)
        return self.applied > 0

    def _rebuild(self) -> None:
        # a dead node's remaining inputs (an edit may have moved one to another value since)
        touched = {id(v): v for n in self._deferred for v in n._inputs if v is not None}
        for v in touched.values():
            v.uses = [(u, j) for u, j in v.uses if id(u) not in self._dead]
        for n in self._deferred:
            n._inputs = [None] * len(n._inputs)

        def place(n: Node, out: list[Node]) -> None:
            for m in self._new.get(id(n), ()):
                place(m, out)
            if id(n) not in self._dead:
                out.append(n)

        nodes: list[Node] = []
        for n in self.graph.nodes:
            place(n, nodes)
        self.graph.nodes = nodes


class BaseRule:
    """What the driver needs of a rule."""

    name: str
    min_opset: int = 1

    def roots(self) -> set[str]:
        raise NotImplementedError

    def possible(self, ops: set[str]) -> bool:
        """False when the rule cannot fire in a graph whose nodes' op types are among `ops`."""
        return True

    def find(self, root: Node, rc: RewriteContext, explain: bool) -> Any:
        """What the rule would rewrite at `root`: a match (anything but a str or None), or why it
        does not fire (a str; worked out only when `explain`), or None."""
        raise NotImplementedError

    def apply(self, root: Node, found: Any, rc: RewriteContext) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Rule(BaseRule):
    """`pattern` -> `replace(match, rc, result)`: the nodes that make the pattern's result value
    instead; `check(match, model)` returns why the match may not fire (None: it may)."""

    name: str
    pattern: Pattern
    replace: Callable[[Match, RewriteContext, Value], list[Node]]
    check: Callable[[Match, Model], str | None] | None = None
    min_opset: int = 1
    # nodes after the pattern's root that the replacement takes too (binding what it needs in
    # match.bound); the result is then the last one's output
    extend: Callable[[Match, set[int]], list[Node]] | None = None

    def roots(self) -> set[str]:
        return _roots(self.pattern)

    def possible(self, ops: set[str]) -> bool:
        return possible(self.pattern, ops)

    def find(self, root: Node, rc: RewriteContext, explain: bool) -> Any:
        if not root.is_onnx():
            return "not an ai.onnx node" if explain else None
        m = match(self.pattern, root, rc.outputs)
        if m is None:
            return why_not(self.pattern, root, rc.outputs) if explain else None
        if self.extend is not None:
            m.nodes += self.extend(m, rc.outputs)
        reason = self.check(m, rc.model) if self.check else None
        return m if reason is None else reason

    def apply(self, root: Node, m: Match, rc: RewriteContext) -> None:
        y = m.nodes[-1].outputs[0]
        rc.free(m.nodes)
        rc.replace(m.nodes, self.replace(m, rc, y))


@dataclass(frozen=True)
class FnRule(BaseRule):
    """A rule in code: `match(root, rc)` returns what to rewrite (anything but a str or None) or
    why not (a str), and `rewrite(root, found, rc)` edits the graph through rc."""

    name: str
    ops: frozenset[str]
    match: Callable[[Node, RewriteContext], Any]
    rewrite: Callable[[Node, Any, RewriteContext], None]
    min_opset: int = 1

    def roots(self) -> set[str]:
        return set(self.ops)

    def find(self, root: Node, rc: RewriteContext, explain: bool) -> Any:
        return self.match(root, rc)

    def apply(self, root: Node, found: Any, rc: RewriteContext) -> None:
        self.rewrite(root, found, rc)


def _roots(p: Pattern) -> set[str]:
    if isinstance(p, Op):
        return {p.op_type}
    if isinstance(p, Or):
        return set().union(*(_roots(a) for a in p.alternatives))
    return set()


def by_root(rules: Sequence[BaseRule]) -> dict[str, list[BaseRule]]:
    """The rules whose sites may be each op type, in rule order."""
    out: dict[str, list[BaseRule]] = {}
    for rule in rules:
        for op in rule.roots():
            out.setdefault(op, []).append(rule)
    return out


def broadcasts_like_x(m: Match, model: Model) -> str | None:
    """The common check of elementwise fusions: the constants add no dims to x."""
    return None if m.broadcasts_like(m["x"]) else "a constant would broadcast x to more dims"


def _fires(found: Any) -> bool:
    return found is not None and not isinstance(found, str)


class RuleSetPass(Pass):
    """A pass that is its rules: `rounds` of rules, each driven to a fixed point over every graph."""

    rounds: ClassVar[Sequence[Sequence[BaseRule]]] = ()
    reverse: ClassVar[bool] = False   # seed the worklist from the outputs (outer patterns first)
    main_graph_only: ClassVar[bool] = False
    max_rewrites_per_node: ClassVar[int] = 8   # a rule set that does not converge stops there

    def not_applicable(self, model: Model) -> str | None:
        """Why the whole pass does nothing on this model (e.g. its opset lacks the fused op)."""
        return None

    def left_fixed_point(self, result: PassResult) -> bool:
        """One round driven to its fixed point leaves nothing to fire (a later round can make
        sites for an earlier one; a rule set stopped before converging can fire again)."""
        return len(self.rounds) <= 1 and not result.stats.get("not_converged")

    def graphs(self, model: Model) -> list[Graph]:
        return [model.graph] if self.main_graph_only else list(model.all_graphs())

    def _rounds(self, model: Model) -> list[dict[str, list[BaseRule]]]:
        opset = model.onnx_opset or 0
        return [by_root([r for r in rnd if opset >= r.min_opset]) for rnd in self.rounds]

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        reason = self.not_applicable(model)
        if reason is not None:
            return PassResult(model, False, {"fired": 0, "reason": reason})
        fired: dict[str, int] = {r.name: 0 for rnd in self.rounds for r in rnd}
        stopped: list[str] = []
        changed = False
        rounds = self._rounds(model)
        for g in self.graphs(model):
            ops = None   # g's op types: gathered again after a round that changed g (it may have made new ones)
            for rules in rounds:
                if ops is None:
                    ops = {n.op_type for n in g.nodes}
                # (no op of the round's roots in g: no candidate site)
                if not ops.isdisjoint(rules) and self._drive(model, g, rules, fired, stopped, set(ops)).finish():
                    changed, ops = True, None
        stats: dict = {"fired": sum(fired.values()), **fired}
        warnings = []
        if stopped:
            stats["not_converged"] = stopped
            warnings = [f"{self.name}: stopped rewriting {', '.join(stopped)} before a fixed point "
                        f"({self.max_rewrites_per_node} rewrites per node)"]
        if self.name in ctx.explain:
            stats["not_fired"] = self.explain(model)
        return PassResult(model, changed, stats, warnings=warnings)

    def _drive(self, model: Model, g: Graph, rules: dict[str, list[BaseRule]], fired: dict[str, int],
               stopped: list[str], ops: set[str]) -> RewriteContext:
        """The worklist: every node once, then what the rewrites touched, until nothing fires;
        returns the context whose `finish` puts the rewrites in place."""
        work = [n for n in g.nodes if n.op_type in rules]
        if not self.reverse:
            work.reverse()   # a stack: pop gives the first node first
        queued = {id(n) for n in work}
        # `ops`: the op types in the graph (and of every node a rewrite made since): a rule whose
        # pattern needs an op not among them is not tried (most fusions, on most nodes of their
        # root op).
        may: dict[int, bool] = {}   # id(rule) -> whether it may fire, given `ops`

        def push(n: Node) -> None:
            if n.op_type not in ops:   # a rewrite made it: every rule is asked again
                ops.add(n.op_type)
                may.clear()
            if n.op_type in rules and id(n) not in queued:
                queued.add(id(n))
                work.append(n)

        rc = RewriteContext(model, g, push)
        budget = self.max_rewrites_per_node * (len(g.nodes) + 16)
        while work:
            n = work.pop()
            queued.discard(id(n))
            if rc.dead(n):
                continue
            for rule in rules[n.op_type]:
                ok = may.get(id(rule))
                if ok is None:
                    ok = may[id(rule)] = rule.possible(ops)
                if not ok:
                    continue
                found = rule.find(n, rc, False)
                if not _fires(found):
                    continue
                if budget == 0:
                    if (g.name or "(main)") not in stopped:
                        stopped.append(g.name or "(main)")
                    return rc
                budget -= 1
                rule.apply(n, found, rc)
                rc.applied += 1
                fired[rule.name] += 1
                break
        return rc

    def _sites(self, model: Model) -> list[tuple[Node, list[str], str | None]]:
        """Each candidate site: the node, why each rule does not fire, the rule that would fire."""
        out = []
        for g in self.graphs(model):
            rc = RewriteContext(model, g)
            for rules in self._rounds(model):
                for n in g.nodes:
                    why = []
                    for rule in rules.get(n.op_type, ()):
                        found = rule.find(n, rc, True)
                        if _fires(found):
                            out.append((n, [], rule.name))
                            break
                        why.append(f"{rule.name}: {found or 'no match'}")
                    else:
                        if why:
                            out.append((n, why, None))
        return out

    def explain(self, model: Model) -> list[dict]:
        """The sites where no rule fired, and why (for --explain-pass)."""
        if self.not_applicable(model) is not None:
            return []
        return [{"node": n.name or n.outputs[0].name if n.outputs else n.op_type, "op": n.op_type, "why": why}
                for n, why, rule in self._sites(model) if rule is None]

    def broken_claims(self, model: Model, ctx: PassContext) -> list[str]:
        return super().broken_claims(model, ctx) + self.remaining(model)

    def remaining(self, model: Model) -> list[str]:
        """Sites where a rule would still fire (the pass claims there are none after it ran)."""
        if self.not_applicable(model) is not None:
            return []
        return [f"{rule} still matches at {n.name or n.outputs[0].name}" for n, _, rule in self._sites(model)
                if rule is not None]
