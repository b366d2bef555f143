"""Cast chains: a Cast through a type that holds every value exactly is one Cast."""

from __future__ import annotations

from mcp_compiler.ir import Attribute, AttrType, DataType, Model, Node, TensorType, Value

from .._infra import REWRITES
from .._pattern import Match, Op, Var
from .._rules import RewriteContext, Rule, RuleSetPass

D = DataType
# source -> the types that represent every value of it exactly
_EXACT = {
    D.BOOL: {D.INT8, D.UINT8, D.INT16, D.UINT16, D.INT32, D.UINT32, D.INT64, D.UINT64, D.FLOAT16, D.BFLOAT16,
             D.FLOAT, D.DOUBLE},
    D.UINT8: {D.INT16, D.UINT16, D.INT32, D.UINT32, D.INT64, D.UINT64, D.FLOAT16, D.BFLOAT16, D.FLOAT, D.DOUBLE},
    D.INT8: {D.INT16, D.INT32, D.INT64, D.FLOAT16, D.BFLOAT16, D.FLOAT, D.DOUBLE},
    D.UINT16: {D.INT32, D.UINT32, D.INT64, D.UINT64, D.FLOAT, D.DOUBLE},
    D.INT16: {D.INT32, D.INT64, D.FLOAT, D.DOUBLE},
    D.UINT32: {D.INT64, D.UINT64, D.DOUBLE},
    D.INT32: {D.INT64, D.DOUBLE},
    D.FLOAT16: {D.FLOAT, D.DOUBLE},
    D.BFLOAT16: {D.FLOAT, D.DOUBLE},
    D.FLOAT: {D.DOUBLE},
}
CHAIN = Op("Cast", Op("Cast", Var("x"), name="inner", where=lambda n: "saturate" not in n.attributes),
           name="outer", where=lambda n: "saturate" not in n.attributes)


def _type(v: Value) -> DataType | None:
    return DataType(v.type.elem_type) if isinstance(v.type, TensorType) and v.type.elem_type else None


def _check(m: Match, model: Model) -> str | None:
    src, mid = _type(m["x"]), DataType(m.node("inner").attributes["to"].value)
    if src is None:
        return "x's element type is unknown"
    return None if mid == src or mid in _EXACT.get(src, ()) else \
        f"{src.name.lower()} -> {mid.name.lower()} can change values"


def _one_cast(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    outer = m.node("outer")
    to = outer.attributes["to"].value
    return [Node("Cast", [m["x"]], [y], name=outer.name, attributes=[Attribute("to", AttrType.INT, to)])]


class SimplifyCastsPass(RuleSetPass):
    """Rule: Cast(Cast(x, T1), T2) -> Cast(x, T2) when every value of x's type S is exact in T1
    (bool and narrower integers into wider integers or floats that hold them, float16/bfloat16
    into float32/float64, float32 into float64): the values reaching the second Cast are x's.
    With T2 = S the Cast that is left is a no-op and identity-elimination removes it (a round
    trip). Exact.
    """

    name = "simplify-casts"
    requires = frozenset()
    establishes = frozenset()
    preserves = REWRITES
    rounds = ((Rule("casts_merged", CHAIN, _one_cast, _check),),)
