"""Undo the 2-D coercion around Softmax that onnx's version converter writes at opset 13."""

from __future__ import annotations

from mcp_compiler.ir import Attribute, AttrType, Model, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES, Property
from .._pattern import Match, Op, Or, Var
from .._rules import RewriteContext, Rule, RuleSetPass

_OPS = ("Softmax", "LogSoftmax", "Hardmax")


def _flatten_to_rows(n: Node) -> bool:
    """Flatten(x, axis=a) whose second dim is x's axis a alone: a is the last axis, or every
    dim after a is a static 1."""
    a, shape = _axis(n, 1), R.shape(n.inputs[0])
    if shape is None or len(shape) < 2:
        return False
    axis = a + len(shape) if a < 0 else a
    return 0 < axis < len(shape) and all(d == 1 for d in shape[axis + 1:])


def _axis(n: Node, default: int) -> int:
    a = n.attributes.get("axis")
    return a.value if a is not None else default


def _over_axis_1(n: Node) -> bool:
    return _axis(n, -1) in (1, -1)   # of the 2-D rows (Softmax's default is -1 at opset 13+)


X = Var("x")
FLAT = Op("Flatten", X, name="flat", where=_flatten_to_rows)
ROWS = Or(*(Op(op, FLAT, name="s", where=_over_axis_1) for op in _OPS))
# back to x's shape: computed from x, or written as a constant (where x's shape is static)
COERCED = Or(Op("Reshape", ROWS, Op("Shape", X, where=lambda n: not n.attributes)),
             Op("Reshape", ROWS, Var("target", where=lambda v: R.const(v) is not None)))


def _back_to_x(m: Match, model: Model) -> str | None:
    if "target" not in m.bound:
        return None
    shape, target = R.shape(m["x"]), R.const(m["target"])
    if shape is None or not all(isinstance(d, int) for d in shape):
        return "the Reshape's constant target needs x's static shape, which is unknown"
    return None if target.tolist() == list(shape) else f"the Reshape's target {target.tolist()} is not x's shape"


def _uncoerced(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    s = m.node("s")
    return [Node(s.op_type, [m["x"]], [y], name=s.name or y.name,
                 attributes=[Attribute("axis", AttrType.INT, _axis(m.node("flat"), 1))])]


class SimplifySoftmaxPass(RuleSetPass):
    """Rule (opset 13+, S one of Softmax, LogSoftmax, Hardmax; x of rank r >= 2):

        Reshape(S(Flatten(x, axis=a), axis=1), Shape(x)) -> S(x, axis=a)

    when a = r-1 or every dim after a is a static 1; Shape(x) may be a constant equal to x's
    static shape. Exact: every row that S normalizes is the same row before and after. onnx's
    version converter writes the left side for every S it takes past opset 13 (where S's axis
    stopped meaning "coerce to 2-D"), so `--opset 13+` on an older model would otherwise add
    two or three nodes per Softmax.
    """

    name = "simplify-softmax"
    requires = frozenset({Property.SHAPES_INFERRED})
    establishes = frozenset()
    preserves = REWRITES

    rounds = ((Rule("simplified", COERCED, _uncoerced, _back_to_x),),)

    def not_applicable(self, model: Model) -> str | None:
        return f"opset {model.onnx_opset} < 13" if model.onnx_opset < 13 else None
