"""Undo the 2-D coercion around Softmax that onnx's version converter writes at opset 13."""

from __future__ import annotations

from mcp_compiler.ir import Attribute, AttrType, Model, Node, TensorType

from .. import _rewrite as R
from .._infra import Pass, PassContext, PassResult, Property
from .._pattern import Op, Or, Var, match

_OPS = ("Softmax", "LogSoftmax", "Hardmax")


def _rank(n: Node) -> int | None:
    t = n.inputs[0].type if n.inputs and n.inputs[0] is not None else None
    return len(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def _flatten_to_last(n: Node) -> bool:
    a = n.attributes.get("axis")
    rank = _rank(n)
    return rank is not None and rank >= 2 and a is not None and a.value in (rank - 1, -1)


def _over_axis_1(n: Node) -> bool:
    a = n.attributes.get("axis")
    return a is not None and a.value in (1, -1)


X = Var("x")
FLAT = Op("Flatten", X, where=_flatten_to_last)
COERCED = Op("Reshape", Or(*(Op(op, FLAT, name="s", where=_over_axis_1) for op in _OPS)),
             Op("Shape", X, where=lambda n: not n.attributes))


class SimplifySoftmaxPass(Pass):
    """Rule (opset 13+, S one of Softmax, LogSoftmax, Hardmax; x of rank r >= 2):

        Reshape(S(Flatten(x, axis=r-1), axis=1), Shape(x)) -> S(x, axis=-1)

    Exact: flattening the leading axes leaves each row of the last axis as it was. onnx's
    version converter writes the left side for every S it takes past opset 13 (where S's axis
    stopped meaning "coerce to 2-D"), so `--opset 13+` on an older model would otherwise add
    three nodes per Softmax.
    """

    name = "simplify-softmax"
    requires = frozenset({Property.SHAPES_INFERRED})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        if opset < 13:
            return PassResult(model, False, {"simplified": 0, "reason": f"opset {opset} < 13"})
        done = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            splice = R.Splice(g)
            for root in g.nodes:
                m = match(COERCED, root, outputs) if root.op_type == "Reshape" else None
                if m is None or splice.taken(m.nodes):
                    continue
                s, y = m.node("s"), root.outputs[0]
                splice.free(m.nodes)
                splice.replace(m.nodes, [Node(s.op_type, [m["x"]], [y], name=s.name or y.name,
                                              attributes=[Attribute("axis", AttrType.INT, -1)])])
                done += 1
            splice.apply()
        return PassResult(model, done > 0, {"simplified": done})
