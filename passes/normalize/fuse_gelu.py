"""Fuse the exported GELU arithmetic (erf or tanh form) into Gelu (opset 20+)."""

from __future__ import annotations

import math

from mcp_compiler.ir import Attribute, AttrType, Model, Node, Value

from .. import _rewrite as R
from .._infra import REWRITES
from .._pattern import Const, Match, Op, Or, Var
from .._rules import RewriteContext, Rule, RuleSetPass, broadcasts_like_x

X = Var("x", where=R.is_float32)
HALF, ONE = Const(0.5), Const(1.0)
ERF_TERM = Op("Add", Op("Erf", Or(Op("Div", X, Const(math.sqrt(2))), Op("Mul", X, Const(1 / math.sqrt(2))))), ONE)
CUBE = Or(Op("Pow", X, Const(3.0)), Op("Mul", X, Op("Mul", X, X)), Op("Mul", Op("Mul", X, X), X))
TANH_TERM = Op("Add", Op("Tanh", Op("Mul", Const(math.sqrt(2 / math.pi)),
                                    Op("Add", X, Op("Mul", Const(0.044715), CUBE)))), ONE)


def gelu_of(term: Op) -> Or:
    """x * term / 2, in the three groupings exporters write."""
    return Or(Op("Mul", Op("Mul", X, term), HALF), Op("Mul", Op("Mul", X, HALF), term),
              Op("Mul", X, Op("Mul", term, HALF)))


def _gelu(approximate: str):  # noqa: ANN202
    attrs = [Attribute("approximate", AttrType.STRING, approximate.encode())] if approximate != "none" else []

    def replace(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
        return [Node("Gelu", [m["x"]], [y], name=m.nodes[-1].name or y.name, attributes=list(attrs))]
    return replace


RULES = (Rule("erf", gelu_of(ERF_TERM), _gelu("none"), broadcasts_like_x),
         Rule("tanh", gelu_of(TANH_TERM), _gelu("tanh"), broadcasts_like_x))


class FuseGeluPass(RuleSetPass):
    """Rules (x float32; constants with one element; intermediates used only in the pattern;
    operands of Add/Mul in either order):

        x * (Erf(x / sqrt(2)) + 1) * 0.5                               -> Gelu(x)
        x * (Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)) + 1) * 0.5        -> Gelu(x, approximate="tanh")

    with x * 1/sqrt(2) for x / sqrt(2), Pow(x, 3) or x * x * x for x^3, and the product grouped
    as (x * t) * 0.5, (x * 0.5) * t or x * (t * 0.5). Only where the model's opset has Gelu
    (20+; --opset 20 raises an older model). The same function, rounded differently in the
    last bits (tests: rtol 1e-5, atol 1e-6).
    """

    name = "fuse-gelu"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES
    rounds = (RULES,)

    def not_applicable(self, model: Model) -> str | None:
        opset = model.onnx_opset
        return f"opset {opset} < 20 (--opset 20 enables it)" if opset is not None and opset < 20 else None
