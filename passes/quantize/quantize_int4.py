"""INT4 weight-only, group-wise quantization of constant MatMul/Gemm (and Conv) weights."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from mcp_compiler.ir import Attribute, AttrType, Model, Node, Value

from .._infra import Pass, PassContext, PassResult, Property
from . import _weights as W
from .numerics import Int4Blocks, quantize_int4
from .options import QuantizeOptions
from .select import Layer, keep_for_budget

MS_DOMAIN = "com.microsoft"


class QuantizeInt4Pass(Pass):
    """Rules (W constant float32, at least --quantize-min-elements values, not excluded):

    - MatMul(A, W[K,N]) -> com.microsoft.MatMulNBits(A, q, scales, zero_points)   (--int4-format matmulnbits)
    - Gemm(A, B, C) -> MatMulNBits(A, q, scales, zero_points, bias=beta*C), with transB and alpha
      folded into W (transA=0, C a constant vector)
    - with --int4-format qdq: W -> DequantizeLinear(q int4/uint4 [K,N], scale, zp, axis=0,
      block_size) feeding the same MatMul/Gemm (ai.onnx opset 21)
    - Conv (with --quantize-conv): W[M,C,kh,kw] -> DequantizeLinear(q, axis=1, block_size) -> Conv

    Groups of --group-size weights along K (the input channels for Conv), asymmetric with a zero
    point unless --symmetric; scales chosen by --int4-method: search (default: a search over
    clipping ranges with a least-squares scale, weighted by the layer's input statistics with
    --calibration-data) or rtn (round to nearest over the full range, onnxruntime's default). A layer whose relative weight error
    exceeds --quantize-max-error stays in float. Every MatMul/Gemm/Conv gets a record saying what
    happened to it and why.
    """

    name = "quantize-int4"
    requires = frozenset()
    establishes = frozenset()
    preserves = frozenset({Property.NO_CONSTANT_NODES, Property.LAYOUT_NHWC})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opts = ctx.quantize or QuantizeOptions(mode="int4")
        g = model.graph
        decisions = W.Decisions()
        namer = W.Namer(model)
        replacements: dict[int, list[Node]] = {}
        originals = []
        qdq = opts.int4_format == "qdq"
        todo = []
        for c in W.candidates(g, opts, decisions):
            conv = c.node.op_type == "Conv"
            if conv and not qdq:
                decisions.skip(c.node, "Conv needs --int4-format qdq (MatMulNBits is a MatMul)", c.weight)
                continue
            k = c.w.shape[1] if conv else c.w.shape[0]
            if k < 16:
                decisions.skip(c.node, f"K = {k} < 16 (too few inputs per output)", c.weight)
                continue
            todo.append(c)
        # --calibration-data: the mean square of each layer's input per channel weights the search
        importance = W.input_importance(model, todo, ctx.calibration) \
            if ctx.calibration and opts.int4_method == "search" else {}
        quantized = W.parallel_map(
            lambda c: quantize_int4(_as_kn(c.w) if c.node.op_type == "Conv" else c.w, opts.block_size,
                                    opts.symmetric, opts.int4_method, importance.get(id(c.node))), todo)
        chosen = [(c, b, err) for c, b in zip(todo, quantized)
                  if (err := W.check_error(c, b.rel_error, opts, decisions)) is not None]
        kept, selection = keep_for_budget(model, ctx, lambda: [
            Layer(c.weight, W.stand_in(c, _from_kn(b.dequantize(), c.w.shape) if c.node.op_type == "Conv"
                                       else b.dequantize()), c.weight.const.nbytes * 7 // 8)
            for c, b, _ in chosen])
        for c, blocks, err in chosen:
            if c.weight.name in kept:
                W.keep_record(decisions, c.node, c.weight)
                continue
            before = c.weight.const.nbytes
            originals += [v for v in c.node.inputs[1:] if v is not None]
            if qdq:
                new, after = _lower_qdq(g, namer, c, blocks)
            else:
                new, after = _lower_matmulnbits(g, namer, c, blocks, opts)
            replacements[id(c.node)] = new
            decisions.done(c, err, "MatMulNBits" if not qdq else "DequantizeLinear(int4)", before, after)
            decisions.rows[-1]["method"] = opts.int4_method + ("+activations" if id(c.node) in importance else "")
            if opts.int4_method != "rtn":   # the error round to nearest would have had
                decisions.rows[-1]["rel_error_rtn"] = round(_rtn_error(c, opts), 6)
        W.splice(g, replacements)
        W.drop_unused_weights(g, originals)
        if replacements and not qdq:
            model.opset_imports.setdefault(MS_DOMAIN, 1)
        stats = decisions.stats()
        if selection is not None:
            stats["selection"] = selection
        return PassResult(model, bool(replacements), stats, details=decisions.rows)


def _rtn_error(c: W.Candidate, opts: QuantizeOptions) -> float:
    w = _as_kn(c.w) if c.node.op_type == "Conv" else c.w
    return quantize_int4(w, opts.block_size, opts.symmetric, "rtn").rel_error


def _as_kn(w: np.ndarray) -> np.ndarray:
    """Conv weight [M, C, *k] -> [C, M * prod(k)]: blocks run along the input channels."""
    m, c = w.shape[:2]
    return np.ascontiguousarray(np.moveaxis(w, 1, -1).reshape(-1, c).T)


def _from_kn(kn: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    m, c, *k = shape
    return np.moveaxis(kn.T.reshape(m, *k, c), -1, 1)


def _lower_matmulnbits(g, namer, c: W.Candidate, b: Int4Blocks, opts: QuantizeOptions):  # noqa: ANN001, ANN202
    n = c.node
    k, cols = c.w.shape
    base = c.weight.name
    q = W.constant(g, namer, f"{base}_q4", np.ascontiguousarray(b.packed()))
    scales = W.constant(g, namer, f"{base}_scales", b.scale.reshape(-1))
    zp = None if opts.symmetric else W.constant(g, namer, f"{base}_zp", b.packed_zero_points())
    bias = None if c.bias is None else W.constant(g, namer, f"{base}_bias", c.bias)
    a = n.inputs[0]
    outs = W.take_outputs(n)
    attrs = [Attribute("K", AttrType.INT, k), Attribute("N", AttrType.INT, cols),
             Attribute("bits", AttrType.INT, 4), Attribute("block_size", AttrType.INT, opts.block_size)]
    if opts.accuracy_level:
        attrs.append(Attribute("accuracy_level", AttrType.INT, opts.accuracy_level))
    inputs = [a, q, scales, zp] + ([None, bias] if bias is not None else [])
    new = Node("MatMulNBits", inputs, outs[:1], domain=MS_DOMAIN, name=n.name, attributes=attrs)
    after = sum(v.const.nbytes for v in (q, scales, zp, bias) if v is not None)
    return [new], after


def _lower_qdq(g, namer, c: W.Candidate, b: Int4Blocks):  # noqa: ANN001, ANN202
    """DequantizeLinear(q, scale, zp, axis, block_size) in place of the float weight."""
    n = c.node
    conv = n.op_type == "Conv"
    cols, nb, bs = b.q.shape
    k = b.k
    q = b.q.reshape(cols, nb * bs)[:, :k]            # [N, K] (N: outputs x kernel positions for Conv)
    if b.symmetric:
        qv, zp = (q.astype(np.int16) - 8).astype(ml_dtypes.int4), None
    else:
        qv, zp = q.astype(ml_dtypes.uint4), b.zero_point.astype(ml_dtypes.uint4)
    scale = b.scale
    if conv:
        m, _, *kern = c.w.shape
        qv = _from_kn(qv.T, c.w.shape)
        scale = _from_kn(scale.T, (m, nb, *kern))
        zp = None if zp is None else _from_kn(zp.T, (m, nb, *kern))
        axis = 1
    else:
        qv, scale = qv.T, scale.T
        zp = None if zp is None else zp.T
        axis = 0
    base = c.weight.name
    qc = W.constant(g, namer, f"{base}_q4", np.ascontiguousarray(qv))
    sc = W.constant(g, namer, f"{base}_scale", np.ascontiguousarray(scale))
    zc = None if zp is None else W.constant(g, namer, f"{base}_zp", np.ascontiguousarray(zp))
    deq = Value(namer(f"{base}_dq"))
    dq = Node("DequantizeLinear", [qc, sc, zc] if zc is not None else [qc, sc], [deq],
              name=namer(f"{n.name or base}_dq"),
              attributes=[Attribute("axis", AttrType.INT, axis), Attribute("block_size", AttrType.INT, bs)])
    if n.op_type == "Gemm":
        _gemm_to_plain(g, namer, n, c)
    n.set_input(1, deq)
    after = sum(v.const.nbytes for v in (qc, sc, zc) if v is not None)
    return [dq, n], after


def _gemm_to_plain(g, namer, n: Node, c: W.Candidate) -> None:  # noqa: ANN001
    """The candidate's W has transB and alpha folded in (and C scaled by beta): say so on the node."""
    for a in ("transB", "alpha", "beta"):
        n.attributes.pop(a, None)
    if c.bias is not None:
        n.set_input(2, W.constant(g, namer, f"{c.weight.name}_bias", c.bias))
