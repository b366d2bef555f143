"""Fuse the exported hard-swish / hard-sigmoid arithmetic into HardSwish or HardSigmoid."""

from __future__ import annotations

from collections.abc import Callable

from mcp_compiler.ir import Attribute, AttrType, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES
from .._pattern import Const, Match, Op, Or, Var
from .._rules import RewriteContext, Rule, RuleSetPass, broadcasts_like_x


def _bounds(lo: float, hi: float) -> Callable[[Node], bool]:
    return lambda n: R.clip_bounds(n) == (lo, hi)


def _sixth_half(n: Node) -> bool:
    a, b = n.attributes.get("alpha"), n.attributes.get("beta")
    return a is not None and abs(a.value - 1 / 6) < 1e-7 and b is not None and abs(b.value - 0.5) < 1e-7


X = Var("x", where=R.is_float32)
RELU6_X3 = Op("Clip", Op("Add", X, Const(3.0)), where=_bounds(0.0, 6.0), more_inputs=True)   # Clip(x + 3, 0, 6)
HARD_SIGMOID = Or(Op("Div", RELU6_X3, Const(6.0)), Op("Mul", RELU6_X3, Const(1 / 6)))
HARD_SWISH = Or(Op("Div", Op("Mul", X, RELU6_X3), Const(6.0)), Op("Mul", Op("Mul", X, RELU6_X3), Const(1 / 6)),
                Op("Mul", X, HARD_SIGMOID))
# Clip(x * a + b, 0, 1), or with x / k for x * a
AFFINE = Op("Add", Or(Op("Mul", X, Const(name="a")), Op("Div", X, Const(name="k"))), Const(name="b"))
CLIP_01 = Op("Clip", AFFINE, where=_bounds(0.0, 1.0), more_inputs=True)
X_HARD_SIGMOID = Op("Mul", X, Op("HardSigmoid", X, where=_sixth_half))


def _hardsigmoid(x: Value, y: Value, name: str, alpha: float = 1 / 6, beta: float = 0.5) -> Node:
    return Node("HardSigmoid", [x], [y], name=name, attributes=[Attribute("alpha", AttrType.FLOAT, alpha),
                                                               Attribute("beta", AttrType.FLOAT, beta)])


def _hardswish(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    x, name = m["x"], m.nodes[-1].name or y.name
    if rc.model.onnx_opset >= 14:
        return [Node("HardSwish", [x], [y], name=name)]
    sig = Value(f"{y.name}__hardsigmoid", y.type)
    return [_hardsigmoid(x, sig, f"{name}_hardsigmoid"), Node("Mul", [x, sig], [y], name=name)]


def _plain_hardsigmoid(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    return [_hardsigmoid(m["x"], y, m.nodes[-1].name or y.name)]


def _affine_hardsigmoid(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    alpha = m.scalar("a") if "a" in m.bound else 1 / m.scalar("k")
    return [_hardsigmoid(m["x"], y, m.nodes[-1].name or y.name, alpha, m.scalar("b"))]


ROUNDS: tuple[tuple[Rule, ...], ...] = (
    (Rule("hardswish", HARD_SWISH, _hardswish, broadcasts_like_x),
     Rule("hardsigmoid", HARD_SIGMOID, _plain_hardsigmoid, broadcasts_like_x),
     Rule("hardsigmoid_affine", CLIP_01, _affine_hardsigmoid, broadcasts_like_x)),
    # second round: what the first made, and what the exporter wrote, at opsets with HardSwish
    (Rule("hardswish_of_hardsigmoid", X_HARD_SIGMOID, _hardswish, broadcasts_like_x, min_opset=14),),
)


class FuseHardSwishPass(RuleSetPass):
    """Rules (x float32; constants with one element; intermediates used only in the pattern;
    operands of Add/Mul in either order):

    - x * Clip(x + 3, 0, 6) / 6 -> HardSwish(x)                          (opset >= 14)
    -                           -> Mul(x, HardSigmoid(x, 1/6, 0.5))      (older opsets)
    - Clip(x + 3, 0, 6) / 6     -> HardSigmoid(x, alpha=1/6, beta=0.5)
    - Clip(x * a + b, 0, 1)     -> HardSigmoid(x, alpha=a, beta=b)       (x / k: alpha = 1/k)
    - x * HardSigmoid(x, 1/6, 0.5) -> HardSwish(x)                       (opset >= 14)
    Mul by 1/6 for Div by 6 matches too. HardSigmoid computes max(0, min(1, alpha*x + beta)):
    the same function, rounded differently in the last bit (tests: rtol 1e-5, atol 1e-6).
    """

    name = "fuse-hardswish"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES
    rounds = ROUNDS
    reverse = True   # outer patterns first: x * (Clip(..) / 6) is one
