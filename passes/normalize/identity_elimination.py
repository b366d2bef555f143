"""Remove no-op nodes."""

from __future__ import annotations

from mcp_compiler.ir import Model, Node, TensorType, Value

from .._infra import ALL, Pass, PassContext, PassResult


class IdentityEliminationPass(Pass):
    """Rules, each y -> x for every consumer of y:

    - Identity(x) -> x
    - Dropout(x) -> x when its mask output is unused and training_mode is absent or a constant
      false (inference)
    - Cast(x, to=T) -> x when x is already of type T
    - Transpose(x, perm) -> x when perm is the identity permutation

    When y is a graph output (the interface keeps its names), x's producer makes y instead and
    x's other consumers read y; not applied when x is a graph input, a constant, a graph output
    itself or made in an enclosing graph.
    """

    name = "identity-elimination"
    requires = frozenset()
    establishes = frozenset()
    preserves = ALL

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        removed = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            here = {id(n) for n in g.nodes}
            done = []
            for n in g.nodes:
                if not n.is_onnx() or not n.inputs or n.inputs[0] is None:
                    continue
                if not _is_noop(n):
                    continue
                y, x = n.outputs[0], n.inputs[0]
                if any(id(o) in outputs for o in n.outputs[1:]):
                    continue
                if y.type is not None and x.type is not None and y.type != x.type and n.op_type != "Identity":
                    continue
                if id(y) not in outputs:
                    y.replace_all_uses_with(x)
                    n.detach()
                elif x.producer is not None and id(x.producer) in here and id(x) not in outputs:
                    _take_over(n, x, y)
                else:
                    continue
                done.append(n)
                removed += 1
            g.remove_nodes(done)
        return PassResult(model, removed > 0, {"nodes_removed": removed})


def _is_noop(n: Node) -> bool:
    op = n.op_type
    if op == "Identity":
        return len(n.outputs) == 1
    if op == "Dropout":
        if len(n.outputs) > 1 and n.outputs[1].uses:
            return False
        if len(n.inputs) >= 3 and n.inputs[2] is not None:
            t = n.inputs[2].const
            return t is not None and not getattr(t, "string_data", None) and not bool(t.numpy().any())
        return "is_test" not in n.attributes or n.attributes["is_test"].value == 1
    if op == "Cast":
        x = n.inputs[0]
        to = n.attributes.get("to")
        return (to is not None and isinstance(x.type, TensorType) and not x.type.sparse
                and int(x.type.elem_type) == to.value and "saturate" not in n.attributes)
    if op == "Transpose":
        perm = n.attributes.get("perm")
        return perm is not None and list(perm.value) == list(range(len(perm.value))) and len(n.outputs) == 1
    return False


def _take_over(n: Node, x: Value, y: Value) -> None:
    """x's producer makes the graph output y (n's result) in x's place; n is left unlinked."""
    for i in range(len(n.inputs)):
        n.set_input(i, None)
    x.replace_all_uses_with(y)
    p, i = x.producer, x.output_index
    p.outputs[i], y.producer, y.output_index = y, p, i
    x.producer = None
    n.outputs = [Value(f"{y.name}__eliminated")]
    n.outputs[0].producer = n
