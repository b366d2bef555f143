"""Reshape shapes computed from the input's own shape -> constants; no-op Reshapes -> gone."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import DataType, Node, TensorType, Value

from .. import _rewrite as R
from .._infra import ALL, Property
from .._rules import FnRule, RewriteContext, RuleSetPass

_INT = (DataType.INT32, DataType.INT64)


class SimplifyReshapePass(RuleSetPass):
    """Rules (Reshape with allowzero unset or 0):

    - Reshape(x, Concat(..., Slice(Shape(x), s, e), ...)) -> Reshape(x, Concat(..., 0 * (e - s), ...))
      when the slice lands at positions s..e of the new shape (a 0 copies the input's dim at its
      position); Casts between int32 and int64 around the shape values are looked through (dims
      fit either). When every piece is then constant the shape becomes one constant and the
      Shape/Slice/Cast/Concat nodes are left to dead-code elimination.
    - Reshape(x, c) with x's shape fully known and equal to c (after resolving 0 and -1) -> x.
    - Reshape(Reshape(x, a), c) -> Reshape(x, c) when c is a constant without 0s: a Reshape
      only reads its input's element count and order.
    - Reshape(Transpose(x, perm), c) -> Reshape(x, c') when the Transpose only moves dims of 1
      (the others keep their order, so the elements keep theirs); a 0 in c (the transposed
      input's dim) becomes that dim, or -1 for the one dim that is not a number.
    """

    name = "simplify-reshape"
    requires = frozenset()
    establishes = frozenset()
    preserves = ALL - {Property.NO_DEAD_CODE, Property.UNIQUE_WEIGHTS}


def _reshape(n: Node) -> str | None:
    if not n.is_onnx() or len(n.inputs) != 2 or any(v is None for v in n.inputs):
        return "not a Reshape of two inputs"
    if "allowzero" in n.attributes and n.attributes["allowzero"].value:
        return "allowzero is set"
    return None


def _own_shape(n: Node, rc: RewriteContext):  # noqa: ANN202
    why = _reshape(n)
    if why is not None:
        return why
    x, s = n.inputs
    if R.const(s) is not None:
        return "its shape is a constant already"
    shape = _own_shape_concat(x, s)
    return shape if shape is not None else "its shape is not a Concat of constants and slices of x's own shape"


def _set_shape(n: Node, shape: np.ndarray, rc: RewriteContext) -> None:
    rc.set_input(n, 1, rc.constant(f"{n.name or 'reshape'}_shape", shape))


def _constant_target(n: Node):  # noqa: ANN202
    """(x, the target shape) of a Reshape whose target is a constant; else why not."""
    why = _reshape(n)
    if why is not None:
        return why
    x, s = n.inputs
    shape = R.const(s)
    return (x, shape) if shape is not None else "its shape is not a constant"


def _through(n: Node, rc: RewriteContext):  # noqa: ANN202
    target = _constant_target(n)
    if isinstance(target, str):
        return target
    x, shape, through = _look_through(n, *target, rc.outputs)
    return (x, shape, through) if through is not None else \
        "its input is not a single-use Reshape, or a Transpose that only moves dims of 1"


def _look_past(n: Node, found, rc: RewriteContext) -> None:  # noqa: ANN001
    x, shape, through = found
    rc.set_input(n, 0, x)
    rc.set_input(n, 1, rc.constant(f"{n.name or 'reshape'}_shape", shape))
    rc.erase(through)


def _noop(n: Node, rc: RewriteContext):  # noqa: ANN202
    target = _constant_target(n)
    if isinstance(target, str):
        return target
    x, shape = target
    if not _same_static_shape(x, shape):
        return "x's shape is not known to be the target already"
    return "its result is a graph output" if rc.is_output(n.outputs[0]) else x


def _remove(n: Node, x: Value, rc: RewriteContext) -> None:
    rc.replace_value(n.outputs[0], x)
    rc.erase(n)


SimplifyReshapePass.rounds = ((FnRule("shapes_made_constant", frozenset({"Reshape"}), _own_shape, _set_shape),
                               FnRule("reshapes_looked_through", frozenset({"Reshape"}), _through, _look_past),
                               FnRule("reshapes_removed", frozenset({"Reshape"}), _noop, _remove)),)


def _look_through(n, x: Value, shape: np.ndarray, outputs: set[int]):  # noqa: ANN001, ANN202 - ir.Node
    """(x, shape, the node looked through) for a Reshape of a Reshape or of a Transpose that
    only moves dims of 1; (x, shape, None) otherwise."""
    p = x.producer
    if p is None or not p.is_onnx("Reshape", "Transpose") or len(x.uses) != 1 or id(x) in outputs:
        return x, shape, None
    shape = shape.reshape(-1).astype(np.int64)
    if p.op_type == "Reshape":
        if (shape == 0).any() or ("allowzero" in p.attributes and p.attributes["allowzero"].value):
            return x, shape, None
        return p.inputs[0], shape, p
    src = R.shape(p.inputs[0])
    perm = p.attributes.get("perm")
    if src is None or perm is None:
        return x, shape, None
    moved = [a for a in perm.value if src[a] != 1]
    if moved != sorted(moved):
        return x, shape, None
    dims = [src[a] for a in perm.value]   # the transposed input's dims, which 0s in the shape copy
    out = shape.copy()
    for i in np.flatnonzero(shape == 0):
        if i >= len(dims):
            return x, shape, None
        if isinstance(dims[i], int):
            out[i] = dims[i]
        elif (out == -1).any():
            return x, shape, None
        else:
            out[i] = -1
    return p.inputs[0], out, p


def _shape_piece(v: Value, x: Value) -> tuple[int, int] | None:
    """(start, end) when v is Slice(Shape(x), start, end) on axis 0, step 1 (through int Casts)."""
    v = _through_casts(v)
    sl = R.producer(v, "Slice")
    if sl is None or len(sl.inputs) < 3:
        return None
    src = _through_casts(sl.inputs[0])
    shp = R.producer(src, "Shape")
    if shp is None or shp.inputs[0] is not x or shp.attributes:
        return None
    start, end = R.const(sl.inputs[1]), R.const(sl.inputs[2])
    axes = R.const(sl.inputs[3]) if len(sl.inputs) > 3 and sl.inputs[3] is not None else np.array([0])
    steps = R.const(sl.inputs[4]) if len(sl.inputs) > 4 and sl.inputs[4] is not None else np.array([1])
    if any(a is None or a.size != 1 for a in (start, end, axes, steps)) or int(axes[0]) != 0 or int(steps[0]) != 1:
        return None
    rank = _rank(x)
    s, e = int(start.reshape(-1)[0]), int(end.reshape(-1)[0])
    if rank is None or s < 0 or e < 0:
        return None
    e = min(e, rank)
    return (s, e) if s < e else None


def _through_casts(v: Value) -> Value:
    while True:
        c = R.producer(v, "Cast")
        if c is None or not isinstance(v.type, TensorType) or v.type.elem_type not in _INT:
            return v
        src = c.inputs[0]
        if not isinstance(src.type, TensorType) or src.type.elem_type not in _INT:
            return v
        v = src


def _own_shape_concat(x: Value, s: Value) -> np.ndarray | None:
    cat = R.producer(_through_casts(s), "Concat")
    if cat is None or not isinstance(s.type, TensorType) or s.type.elem_type != DataType.INT64:
        return None
    parts, pos = [], 0
    for piece in cat.inputs:
        c = R.const(piece)
        if c is not None:
            if c.ndim != 1:
                return None
            parts.append(c.astype(np.int64))
            pos += c.size
            continue
        se = _shape_piece(piece, x)
        if se is None or se[0] != pos:
            return None
        parts.append(np.zeros(se[1] - se[0], np.int64))
        pos += se[1] - se[0]
    return np.concatenate(parts) if parts else None


def _rank(x: Value) -> int | None:
    shape = R.shape(x)
    return len(shape) if shape is not None else None


def _same_static_shape(x: Value, shape: np.ndarray) -> bool:
    t = x.type
    if not isinstance(t, TensorType) or t.shape is None or not all(isinstance(d, int) for d in t.shape):
        return False
    dims = list(t.shape)
    want = [dims[i] if int(d) == 0 and i < len(dims) else int(d) for i, d in enumerate(shape.reshape(-1))]
    if want.count(-1) == 1:
        known = int(np.prod([d for d in want if d != -1])) if len(want) > 1 else 1
        total = int(np.prod(dims))
        if known == 0 or total % known:
            return False
        want[want.index(-1)] = total // known
    return want == dims
