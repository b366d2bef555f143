"""How each Property is checked: what `--verify-each` runs after a pass that claims it.

Each check returns the violations in words (empty: the property holds).
"""

from __future__ import annotations

from collections.abc import Callable

from mcp_compiler.ir import Model

from ._infra import PassContext, Property


def no_constant_nodes(model: Model, ctx: PassContext) -> list[str]:
    """No Constant node that could be an initializer (function bodies, graph outputs and IR
    versions before 4 keep theirs)."""
    from .normalize.constant_to_initializer import movable_constants

    return [f"Constant node {n.name or n.outputs[0].name!r} could be an initializer" for n in movable_constants(model)]


def no_dead_code(model: Model, ctx: PassContext) -> list[str]:
    """No node all of whose outputs are unused, no unused initializer (DCE's rule)."""
    bad = []
    for g in model.all_graphs():
        outputs, inputs = {id(v) for v in g.outputs}, {id(v) for v in g.inputs}
        bad += [f"node {n.name or n.op_type!r} is unused" for n in g.nodes
                if not any(o.uses or id(o) in outputs for o in n.outputs)]
        bad += [f"initializer {k!r} is unused" for k, v in g.initializers.items()
                if not v.uses and id(v) not in outputs and id(v) not in inputs]
    return bad


def shapes_inferred(model: Model, ctx: PassContext) -> list[str]:
    """Every tensor the main graph returns has a known rank (the contract the target emits)."""
    from mcp_compiler.ir import TensorType

    return [f"graph output {v.name!r} has no shape" for v in model.graph.outputs
            if isinstance(v.type, TensorType) and v.type.shape is None]


def target_legal(model: Model, ctx: PassContext) -> list[str]:
    if ctx.target is None:
        return []
    return list(ctx.target.is_legal(model))


def layout_nhwc(model: Model, ctx: PassContext) -> list[str]:
    """Every interface value marked NHWC is 4-D (its contract is [N, H, W, C])."""
    from mcp_compiler.ir import Layout

    g = model.graph
    return [f"{v.name!r} is marked NHWC but has shape {v.type.shape}" for v in [*g.inputs, *g.outputs]
            if v.layout == Layout.NHWC and (getattr(v.type, "shape", None) is None or len(v.type.shape) != 4)]


def unique_weights(model: Model, ctx: PassContext) -> list[str]:
    from .normalize.dedup_weights import duplicate_groups

    return [f"initializers {', '.join(repr(v.name) for v in group)} hold the same bytes"
            for g in model.all_graphs() for group in duplicate_groups(g)]


CHECKS: dict[Property, Callable[[Model, PassContext], list[str]]] = {
    Property.NO_CONSTANT_NODES: no_constant_nodes,
    Property.NO_DEAD_CODE: no_dead_code,
    Property.SHAPES_INFERRED: shapes_inferred,
    Property.TARGET_LEGAL: target_legal,
    Property.LAYOUT_NHWC: layout_nhwc,
    Property.UNIQUE_WEIGHTS: unique_weights,
}


def violations(prop: Property, model: Model, ctx: PassContext) -> list[str]:
    return CHECKS[prop](model, ctx)
