"""Rewrite passes as rule sets (onnxscript's shape): a rule is a pattern, a replacement and a
check that says why a match may not fire; one driver iterates, counts, and explains.

A candidate site is a node of the pattern's root op. At each one the driver tries the rules in
order: the first that matches and passes its check is replaced (through `Splice`, so a node is
never rewritten twice in one sweep). Sites where no rule fired keep the reasons, which
`--explain-pass NAME` prints (and `remaining()` checks the pass's claim that no rule fires
after it ran: `--verify-each`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from mcp_compiler.ir import Graph, Model, Node, Value

from . import _rewrite as R
from ._infra import Pass, PassContext, PassResult
from ._pattern import Match, Op, Or, Pattern, match, why_not


@dataclass(frozen=True)
class Rule:
    """`pattern` -> `replace(match, graph, model, result)`: the nodes that make the pattern's
    result value instead; `check(match, model)` returns why the match may not fire (None: it may)."""

    name: str
    pattern: Pattern
    replace: Callable[[Match, Graph, Model, Value], list[Node]]
    check: Callable[[Match, Model], str | None] | None = None
    min_opset: int = 1
    # nodes after the pattern's root that the replacement takes too (binding what it needs in
    # match.bound); the result is then the last one's output
    extend: Callable[[Match, set[int]], list[Node]] | None = None

    def roots(self) -> set[str]:
        return _roots(self.pattern)


def _by_root(rules: Sequence[Rule]) -> dict[str, list[Rule]]:
    """The rules whose pattern may start at each op type, in rule order."""
    out: dict[str, list[Rule]] = {}
    for rule in rules:
        for op in rule.roots():
            out.setdefault(op, []).append(rule)
    return out


def _roots(p: Pattern) -> set[str]:
    if isinstance(p, Op):
        return {p.op_type}
    if isinstance(p, Or):
        return set().union(*(_roots(a) for a in p.alternatives))
    return set()


def broadcasts_like_x(m: Match, model: Model) -> str | None:
    """The common check of elementwise fusions: the constants add no dims to x."""
    return None if m.broadcasts_like(m["x"]) else "a constant would broadcast x to more dims"


class RuleSetPass(Pass):
    """A pass that is its rules: `rounds` of rules, each round a sweep over every graph."""

    rounds: ClassVar[Sequence[Sequence[Rule]]] = ()
    reverse: ClassVar[bool] = False   # sweep from the outputs (outer patterns first)
    until_fixpoint: ClassVar[bool] = False   # repeat each round's sweep until nothing fires (chains)
    max_sweeps: ClassVar[int] = 16

    def not_applicable(self, model: Model) -> str | None:
        """Why the whole pass does nothing on this model (e.g. its opset lacks the fused op)."""
        return None

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        reason = self.not_applicable(model)
        if reason is not None:
            return PassResult(model, False, {"fired": 0, "reason": reason})
        fired: dict[str, int] = {r.name: 0 for rnd in self.rounds for r in rnd}
        misses: list[dict] = []
        explain = self.name in ctx.explain
        for rnd in self.rounds:
            by_root = _by_root([r for r in rnd if (model.onnx_opset or 0) >= r.min_opset])
            for g in model.all_graphs():
                if not any(n.op_type in by_root for n in g.nodes):
                    continue   # no candidate site: the sweep (and its name table) would find nothing
                for _ in range(self.max_sweeps if self.until_fixpoint else 1):
                    sweep_misses: list[dict] | None = [] if explain else None
                    done = self._sweep(model, g, by_root, sweep_misses)
                    for name in done:
                        fired[name] += 1
                    if not done:
                        break
                misses += sweep_misses or []   # the last sweep's: the sites that never fired
        stats: dict = {"fired": sum(fired.values()), **fired}
        if explain:
            stats["not_fired"] = misses
        return PassResult(model, stats["fired"] > 0, stats)

    def _sweep(self, model: Model, g: Graph, by_root: dict[str, list[Rule]], misses: list[dict] | None) -> list[str]:
        """One sweep of the rules (by root op) over g; `misses` (when explaining) gets why each
        site did not fire."""
        outputs = {id(v) for v in g.outputs}
        splice = R.Splice(g)
        done = []
        R._SWEEP_NAMES[id(g)] = R.value_names(g)
        try:
            self._sweep_nodes(model, g, by_root, misses, outputs, splice, done)
        finally:
            del R._SWEEP_NAMES[id(g)]
        splice.apply()
        return done

    def _sweep_nodes(self, model: Model, g: Graph, by_root: dict[str, list[Rule]], misses: list[dict] | None,
                     outputs: set[int], splice: R.Splice, done: list[str]) -> None:
        for root in (reversed(g.nodes) if self.reverse else list(g.nodes)):
            candidates = by_root.get(root.op_type)
            if not candidates or not root.is_onnx():
                continue
            why = []
            for rule in candidates:
                m = match(rule.pattern, root, outputs)
                if m is not None and rule.extend is not None:
                    m.nodes += rule.extend(m, outputs)
                if m is None and misses is None:
                    continue   # why it did not match is worked out only for --explain-pass
                reason = (why_not(rule.pattern, root, outputs) if m is None else
                          "its nodes were rewritten by another match" if splice.taken(m.nodes) else
                          rule.check(m, model) if rule.check else None)
                if reason is not None:
                    why.append(f"{rule.name}: {reason}")
                    continue
                y = m.nodes[-1].outputs[0]
                splice.free(m.nodes)
                splice.replace(m.nodes, rule.replace(m, g, model, y))
                done.append(rule.name)
                why = []
                break
            if why and misses is not None:
                misses.append({"node": root.name or root.outputs[0].name, "op": root.op_type, "why": why})

    def broken_claims(self, model: Model, ctx: PassContext) -> list[str]:
        return super().broken_claims(model, ctx) + self.remaining(model)

    def remaining(self, model: Model) -> list[str]:
        """Sites where a rule would still fire (the pass claims there are none after it ran)."""
        if self.not_applicable(model) is not None:
            return []
        left = []
        for rnd in self.rounds:
            for g in model.all_graphs():
                outputs = {id(v) for v in g.outputs}
                for root in g.nodes:
                    for rule in rnd:
                        if (model.onnx_opset or 0) < rule.min_opset or root.op_type not in rule.roots():
                            continue
                        m = match(rule.pattern, root, outputs)
                        if m is not None and (rule.check is None or rule.check(m, model) is None):
                            left.append(f"{rule.name} still matches at {root.name or root.outputs[0].name}")
        return left
