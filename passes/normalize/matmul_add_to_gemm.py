"""MatMul of a 2-D input by a constant, then Add of a constant bias -> Gemm."""

from __future__ import annotations

from mcp_compiler.ir import Model, Node, TensorType

from .. import _rewrite as R
from .._infra import Pass, PassContext, PassResult, Property


class MatMulAddToGemmPass(Pass):
    """Rule: Add(MatMul(A, B), C) -> Gemm(A, B, C) when A is known 2-D, B a 2-D float32
    constant [K, N], C a float32 constant of shape [N] or [1, N] (Gemm broadcasts it the same
    way), and the MatMul's output is used only by the Add. Exact: Gemm computes A @ B + C.
    """

    name = "matmul-add-to-gemm"
    requires = frozenset({Property.SHAPES_INFERRED})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        fused = 0
        for g in model.all_graphs():
            outputs = {id(v) for v in g.outputs}
            repl: dict[int, list[Node]] = {}
            dead = set()
            for add in g.nodes:
                if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
                    continue
                a, b = add.inputs
                mm_out, c = (a, b) if R.producer(a, "MatMul") is not None else (b, a)
                mm = R.producer(mm_out, "MatMul")
                if mm is None or R.only_use(mm_out, outputs) is not add:
                    continue
                x, w = mm.inputs
                wa, ca = R.const(w), R.const(c)
                t = x.type
                if wa is None or ca is None or wa.ndim != 2 or wa.dtype.name != "float32" or ca.dtype.name != "float32":
                    continue
                if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != 2:
                    continue
                if ca.shape not in ((wa.shape[1],), (1, wa.shape[1])):
                    continue
                y = add.outputs[0]
                for n in (mm, add):
                    for i in range(len(n.inputs)):
                        n.set_input(i, None)
                y.producer = None
                add.outputs = []
                repl[id(add)] = [Node("Gemm", [x, w, c], [y], name=mm.name or add.name)]
                mm_out.producer = None
                mm.outputs = []
                dead.add(id(mm))
                fused += 1
            if repl:
                g.nodes = [m for n in g.nodes if id(n) not in dead for m in repl.get(id(n), [n])]
        return PassResult(model, fused > 0, {"gemms_formed": fused})
