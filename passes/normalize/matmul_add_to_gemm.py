"""MatMul of a 2-D input by a constant, then Add of a constant bias -> Gemm."""

from __future__ import annotations

from mcp_compiler.ir import Model, Node, TensorType, Value

from .. import _rewrite as R
from .._infra import REWRITES, Property
from .._pattern import Match, Op, Var
from .._rules import RewriteContext, Rule, RuleSetPass

MATMUL_ADD = Op("Add", Op("MatMul", Var("a"), Var("b")), Var("c"))


def _check(m: Match, model: Model) -> str | None:
    wa, ca, t = R.const(m["b"]), R.const(m["c"]), m["a"].type
    if wa is None or wa.ndim != 2 or wa.dtype.name != "float32":
        return "B is not a 2-D float32 constant"
    if ca is None or ca.dtype.name != "float32":
        return "C is not a float32 constant"
    if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != 2:
        return "A is not known to be 2-D"
    if ca.shape not in ((wa.shape[1],), (1, wa.shape[1])):
        return f"C's shape {list(ca.shape)} is not [N] or [1, N] (N = {wa.shape[1]})"
    return None


def _gemm(m: Match, rc: RewriteContext, y: Value) -> list[Node]:
    mm = m.nodes[0]
    return [Node("Gemm", [m["a"], m["b"], m["c"]], [y], name=mm.name or m.nodes[-1].name)]


class MatMulAddToGemmPass(RuleSetPass):
    """Rule: Add(MatMul(A, B), C) -> Gemm(A, B, C) when A is known 2-D, B a 2-D float32
    constant [K, N], C a float32 constant of shape [N] or [1, N] (Gemm broadcasts it the same
    way), and the MatMul's output is used only by the Add. Exact: Gemm computes A @ B + C.
    """

    name = "matmul-add-to-gemm"
    requires = frozenset({Property.SHAPES_INFERRED})
    establishes = frozenset()
    preserves = REWRITES
    rounds = ((Rule("gemms_formed", MATMUL_ADD, _gemm, _check),),)
