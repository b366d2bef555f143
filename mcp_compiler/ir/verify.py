"""IR invariants, checked after each pass under --verify-each and in tests."""

from __future__ import annotations

from ..errors import McpError
from .graph import Graph, Model, Value


class IRVerificationError(McpError):
    """The IR broke an invariant: a pass bug, never a user error."""

    exit_code = 1


def verify(model: Model) -> None:
    """Raise IRVerificationError unless every graph is in topological order, every input is
    defined before use (in its graph or an enclosing one), names are unique per graph, and the
    use lists match the node inputs."""
    _graph(model.graph, [])
    for f in model.functions:
        _graph(f.body, [], where=f"function {f.name}")


def _graph(g: Graph, outer: list[set[int]], where: str = "graph") -> None:
    defined: set[int] = set()
    names: set[str] = set()

    def define(v: Value) -> None:
        if v.name and v.name in names:
            raise IRVerificationError(f"{where} {g.name!r}: value name {v.name!r} defined twice")
        names.add(v.name)
        defined.add(id(v))

    for v in g.inputs:
        define(v)
    for v in list(g.initializers.values()) + list(g.sparse_initializers.values()):
        if id(v) not in defined:
            define(v)
    scopes = [*outer, defined]
    use_sets: dict[int, set[tuple[int, int]]] = {}
    for n in g.nodes:
        for i, v in enumerate(n._inputs):   # (the list itself: n.inputs makes a tuple per call)
            if v is None:
                continue
            if id(v) not in defined and not any(id(v) in s for s in outer):
                raise IRVerificationError(f"{where} {g.name!r}: node {n.name or n.op_type!r} input "
                                          f"{v.name!r} is not defined before it")
            if not _used_by(v, n, i, use_sets):
                raise IRVerificationError(f"{where}: use list of {v.name!r} misses {n.op_type} input {i}")
        if n.attributes:
            for sub in n.subgraphs():
                _graph(sub, scopes, where=f"{where}/{n.name or n.op_type}")
        for i, o in enumerate(n.outputs):
            if o.producer is not n or o.output_index != i:
                raise IRVerificationError(f"{where}: {o.name!r} does not name its producer")
            define(o)
    for v in g.outputs:
        if not any(id(v) in s for s in scopes):
            raise IRVerificationError(f"{where} {g.name!r}: graph output {v.name!r} is not defined")
    for n in g.nodes:
        for o in n.outputs:
            for user, idx in o.uses:
                if user._inputs[idx] is not o:
                    raise IRVerificationError(f"{where}: stale use of {o.name!r} by {user.op_type}")


def _used_by(v: Value, n, i: int, cache: dict[int, set[tuple[int, int]]]) -> bool:  # noqa: ANN001 - a Node
    """(n, i) is among v's uses: looked through for a few uses, through a set for many (a weight
    shared by every layer has thousands: a scan per input would make the check quadratic)."""
    uses = v.uses
    if len(uses) <= 8:
        return any(u is n and j == i for u, j in uses)
    return (id(n), i) in _uses(v, cache)


def _uses(v: Value, cache: dict[int, set[tuple[int, int]]]) -> set[tuple[int, int]]:
    """v's uses as a set (a weight shared by every layer has thousands: a scan per input of the
    list would make the check quadratic)."""
    got = cache.get(id(v))
    if got is None:
        got = cache[id(v)] = {(id(u), j) for u, j in v.uses}
    return got
