"""Remove nodes and initializers nothing uses."""

from __future__ import annotations

from mcp_compiler.ir import Graph, Model

from .._infra import ALL, Pass, PassContext, PassResult, Property


class DeadCodeEliminationPass(Pass):
    """Drop every node none of whose outputs is used (by a node here or in a subgraph, or as a
    graph output), in reverse order so chains go at once; then drop unused initializers.

    Graph inputs are kept (they are the interface), and so are initializers that are also graph
    inputs. Establishes: no-dead-code.
    """

    name = "dead-code-elimination"
    requires = frozenset()
    establishes = frozenset({Property.NO_DEAD_CODE})
    preserves = ALL
    idempotent = True
    # shapes are inferred forward: removing what nothing uses changes no live value's
    keeps_fixed_points = frozenset({"infer-shapes"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        nodes = inits = 0
        # Inner graphs first: a subgraph's dead nodes may be what keeps an outer value alive.
        for g in reversed(list(model.all_graphs())):
            n, i = _sweep(g)
            nodes, inits = nodes + n, inits + i
        return PassResult(model, nodes + inits > 0, {"nodes_removed": nodes, "initializers_removed": inits})


def _sweep(g: Graph) -> tuple[int, int]:
    live_outputs = {id(v) for v in g.outputs}
    dead = []
    for n in reversed(g.nodes):
        outs = n.outputs
        if len(outs) == 1:   # (most nodes: no generator)
            if outs[0].uses or id(outs[0]) in live_outputs:
                continue
        elif any(o.uses or id(o) in live_outputs for o in outs):
            continue
        n.detach()  # now its inputs may have lost their last use: seen as we walk back
        dead.append(n)
    removed = g.remove_nodes(dead)
    inputs = {id(v) for v in g.inputs}
    dead = [k for k, v in g.initializers.items()
            if not v.uses and id(v) not in live_outputs and id(v) not in inputs]
    dead_sparse = [k for k, v in g.sparse_initializers.items()
                   if not v.uses and id(v) not in live_outputs and id(v) not in inputs]
    for k in dead:
        del g.initializers[k]
    for k in dead_sparse:
        del g.sparse_initializers[k]
    for name in [k for k, v in g.value_info.items() if v.producer is None and id(v) not in inputs
                 and g.initializers.get(k) is not v and g.sparse_initializers.get(k) is not v]:
        del g.value_info[name]  # annotations of values that no longer exist
    return removed, len(dead) + len(dead_sparse)
