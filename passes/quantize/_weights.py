"""Finding the constant weights of MatMul/Gemm/Conv and swapping in quantized ones.

Shared by the INT4 and FP8 passes: which nodes are candidates (and why the others are not),
fresh names, and replacing a node in place without rescanning the graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from mcp_compiler.ir import DataType, Graph, Model, Node, Tensor, TensorType, Value

from .. import _rewrite as R
from .options import QuantizeOptions


@dataclass
class Candidate:
    """A node whose weight can be quantized. `w` is the weight as the node multiplies by it:
    [K, N] for MatMul and Gemm (transB and alpha applied), [M, C, kh, kw] for Conv."""

    node: Node
    weight: Value
    w: np.ndarray
    bias: np.ndarray | None = None     # Gemm: beta * C, shape [N]


@dataclass
class Decisions:
    """One record per MatMul/Gemm/Conv node: quantized or skipped, and why."""

    rows: list[dict] = field(default_factory=list)

    def skip(self, node: Node, reason: str, weight: Value | None = None) -> None:
        self.rows.append({"node": node.name, "op": node.op_type, "weight": weight.name if weight else None,
                          "action": "skipped", "reason": reason})

    def done(self, c: Candidate, rel_error: float, fmt: str, bytes_before: int, bytes_after: int) -> None:
        self.rows.append({"node": c.node.name, "op": c.node.op_type, "weight": c.weight.name,
                          "shape": list(c.w.shape), "action": "quantized", "format": fmt,
                          "rel_error": round(rel_error, 6), "bytes_before": bytes_before,
                          "bytes_after": bytes_after})

    @property
    def quantized(self) -> int:
        return sum(r["action"] == "quantized" for r in self.rows)

    def stats(self) -> dict[str, int]:
        q = [r for r in self.rows if r["action"] == "quantized"]
        return {"quantized": len(q), "skipped": len(self.rows) - len(q),
                "weight_bytes_before": sum(r["bytes_before"] for r in q),
                "weight_bytes_after": sum(r["bytes_after"] for r in q)}


def candidates(g: Graph, opts: QuantizeOptions, decisions: Decisions) -> list[Candidate]:
    out = []
    for n in g.nodes:
        if not n.is_onnx() or n.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        if n.op_type == "Conv" and not opts.conv:
            decisions.skip(n, "Conv weights are quantized only with --quantize-conv")
            continue
        c = _candidate(n, opts, decisions)
        if c is not None:
            out.append(c)
    return out


def compressed(v) -> str | None:  # noqa: ANN001 - an ir Value
    """What an already-compressed weight is, when the weight input is one: a constant behind
    DequantizeLinear (int8/uint8/int4/fp8 QDQ weights), or a half-precision constant behind a
    Cast, possibly through a Transpose/Reshape."""
    seen = 0
    while v is not None and v.const is None and v.producer is not None and seen < 4:
        p = v.producer
        src = p.inputs[0] if p.inputs else None
        if p.op_type == "DequantizeLinear" and src is not None and isinstance(src.const, Tensor):
            return f"{src.const.dtype.name.lower()} QDQ weights: already quantized"
        if p.op_type == "Cast" and src is not None and isinstance(src.const, Tensor) \
                and src.const.dtype in (DataType.FLOAT16, DataType.BFLOAT16):
            return f"{src.const.dtype.name.lower()} weights: nothing to do"
        if p.op_type not in ("Transpose", "Reshape", "Cast", "Identity"):
            return None
        v, seen = src, seen + 1
    return None


def _candidate(n: Node, opts: QuantizeOptions, decisions: Decisions) -> Candidate | None:
    wv = n.inputs[1] if len(n.inputs) > 1 else None
    if wv is None or not isinstance(wv.const, Tensor):
        decisions.skip(n, compressed(wv) or "weight is not a constant", wv)
        return None
    pat = opts.excluded(n.name, wv.name)
    if pat:
        decisions.skip(n, f"excluded by --quantize-exclude {pat}", wv)
        return None
    t = wv.const
    if t.dtype != DataType.FLOAT:
        decisions.skip(n, f"{t.dtype.name.lower()} weight (only float32 is quantized)", wv)
        return None
    if t.numel < max(opts.min_elements, 1):
        decisions.skip(n, f"too small ({t.numel} elements < {opts.min_elements})", wv)
        return None
    w = t.numpy()
    attrs = n.attributes
    bias = None
    if n.op_type == "MatMul":
        if w.ndim != 2:
            decisions.skip(n, f"{w.ndim}-D weight (MatMul weights must be 2-D)", wv)
            return None
        a = n.inputs[0].type
        if isinstance(a, TensorType) and a.shape is not None and len(a.shape) < 2:
            decisions.skip(n, "1-D activation", wv)
            return None
    elif n.op_type == "Gemm":
        if attrs.get("transA") is not None and attrs["transA"].value:
            decisions.skip(n, "Gemm with transA=1", wv)
            return None
        if attrs.get("transB") is not None and attrs["transB"].value:
            w = w.T
        alpha = attrs["alpha"].value if "alpha" in attrs else 1.0
        if alpha != 1.0:
            w = w * np.float32(alpha)
        if len(n.inputs) > 2 and n.inputs[2] is not None:
            cv = n.inputs[2]
            if not isinstance(cv.const, Tensor) or cv.const.dtype != DataType.FLOAT or cv.const.numel not in (1, w.shape[1]) \
                    or len(cv.const.dims) > 1 and cv.const.dims[0] != 1:
                decisions.skip(n, "Gemm bias is not a constant float vector", wv)
                return None
            beta = attrs["beta"].value if "beta" in attrs else 1.0
            bias = np.broadcast_to(cv.const.numpy().reshape(-1) * np.float32(beta), (w.shape[1],)).astype(np.float32)
    else:  # Conv
        if w.ndim < 3:
            decisions.skip(n, f"{w.ndim}-D Conv weight", wv)
            return None
    return Candidate(n, wv, np.ascontiguousarray(w, np.float32), bias)


def check_error(c: Candidate, err: float, opts: QuantizeOptions, decisions: Decisions) -> float | None:
    """The relative weight error, or None (and a skip record) when it exceeds --quantize-max-error."""
    if opts.max_error is not None and err > opts.max_error:
        decisions.skip(c.node, f"relative weight error {err:.4f} > --quantize-max-error {opts.max_error}", c.weight)
        return None
    return err


def stand_in(c: Candidate, w: np.ndarray) -> np.ndarray:
    """A dequantized weight in the candidate's layout ([K, N] for MatMul/Gemm) back in the
    weight's own layout (Gemm: transB and alpha undone), float32: what selection feeds for it."""
    if c.node.op_type == "Gemm":
        attrs = c.node.attributes
        alpha = attrs["alpha"].value if "alpha" in attrs else 1.0
        if alpha != 1.0:
            w = w / np.float32(alpha)
        if attrs.get("transB") is not None and attrs["transB"].value:
            w = w.T
    return np.ascontiguousarray(w, np.float32).reshape(c.weight.const.dims)


def keep_record(decisions: Decisions, node: Node, weight: Value) -> None:
    """A layer --accuracy-budget's selection keeps in float."""
    decisions.skip(node, "kept in float to hold --accuracy-budget (most sensitive)", weight)


def parallel_map(fn, items: list) -> list:  # noqa: ANN001
    """fn over items on a few threads (numpy releases the GIL in the array work), in order."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    workers = min(len(items), os.cpu_count() or 1, 8)
    if workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, items))


class Namer:
    """Fresh value names for one model (never reusing a name any graph has)."""

    def __init__(self, model: Model) -> None:
        self.used: set[str] = set().union(*(R.value_names(g) for g in model.all_graphs()))

    def __call__(self, base: str) -> str:
        return R.fresh_name(self.used, base)


def constant(g: Graph, namer: Namer, base: str, array: np.ndarray) -> Value:
    return R.new_constant(g, namer.used, base, array)


def take_outputs(old: Node) -> list[Value]:
    """Detach `old` from its inputs and outputs; returns the outputs for the replacement."""
    outs = list(old.outputs)
    for o in outs:
        o.producer, o.output_index = None, -1
    old.outputs = []
    for i in range(len(old.inputs)):
        old.set_input(i, None)
    return outs


def splice(g: Graph, replacements: dict[int, list[Node]]) -> None:
    """Rebuild g.nodes once: each node id in `replacements` becomes its list of nodes."""
    if not replacements:
        return
    nodes = []
    for n in g.nodes:
        nodes.extend(replacements.get(id(n), [n]))
    g.nodes = nodes


def drop_unused_weights(g: Graph, weights: list[Value]) -> int:
    """Remove the original float weights nothing uses any more; returns bytes freed."""
    interface = {id(v) for v in [*g.inputs, *g.outputs]}
    freed = 0
    for v in {id(w): w for w in weights}.values():
        if not v.uses and id(v) not in interface and g.initializers.get(v.name) is v:
            freed += v.const.nbytes
            del g.initializers[v.name]
    return freed


def input_importance(model: Model, chosen: list[Candidate], samples: list[dict]) -> dict[int, np.ndarray]:
    """Per candidate node (by id): the mean square over the calibration samples of its input,
    per input channel (the last axis for MatMul/Gemm, axis 1 for Conv): [K]."""
    acts = {id(c.node): c.node.inputs[0] for c in chosen if c.node.inputs[0] is not None
            and c.node.inputs[0].const is None}
    if not acts:
        return {}
    conv = {id(c.node) for c in chosen if c.node.op_type == "Conv"}
    sums: dict[int, np.ndarray] = {}
    counts: dict[int, int] = {}
    for values in run_with_outputs(model, list({id(a): a for a in acts.values()}.values()), samples):
        for nid, a in acts.items():
            x = np.asarray(values[a.name], np.float32)
            x = np.moveaxis(x, 1, -1) if nid in conv and x.ndim > 2 else x
            x = x.reshape(-1, x.shape[-1])
            sums[nid] = sums.get(nid, 0) + np.einsum("ij,ij->j", x, x)
            counts[nid] = counts.get(nid, 0) + x.shape[0]
    return {nid: (sums[nid] / max(counts[nid], 1)).astype(np.float32) for nid in sums}


def run_with_outputs(model: Model, values: list[Value], samples: list[dict]) -> Iterator[dict[str, np.ndarray]]:
    """Run the model on each sample with `values` made outputs too; yields {name: array}."""
    from mcp_compiler.session import create_session

    g = model.graph
    saved = list(g.outputs)
    g.outputs = saved + [a for a in values if a not in saved]
    try:
        sess = create_session(model)
    finally:
        g.outputs = saved
    names = [o.name for o in sess.get_outputs()]
    for feeds in samples:
        yield dict(zip(names, sess.run(None, feeds)))
