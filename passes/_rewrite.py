"""Small helpers for local rewrites: constants, single uses, swapping a value's producer."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import DataType, Graph, Node, Tensor, TensorType, Value


def c_order(a: np.ndarray) -> np.ndarray:
    """`a` in C order, keeping its shape: np.ascontiguousarray turns a 0-d array into shape (1,),
    which would make a scalar constant a 1-element vector (and change ranks downstream)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def const(v: Value | None) -> np.ndarray | None:
    """The value's constant as a numpy array (dense tensors of numpy dtypes), else None."""
    if v is None or not isinstance(v.const, Tensor) or v.const.string_data is not None:
        return None
    if v.const.dtype.packed or v.const.dtype.numpy_dtype.type.__module__ != "numpy":
        return None
    return v.const.numpy()


def scalar(v: Value | None) -> float | None:
    a = const(v)
    return float(a.reshape(-1)[0]) if a is not None and a.size == 1 else None


def only_use(v: Value, outputs: set[int]) -> Node | None:
    """The one node using v, when v has exactly one use and is not a graph output."""
    if id(v) in outputs or len(v.uses) != 1:
        return None
    return v.uses[0][0]


def producer(v: Value | None, op: str) -> Node | None:
    p = v.producer if v is not None else None
    return p if p is not None and p.op_type == op and p.is_onnx() else None


def fresh_name(names: set[str], base: str) -> str:
    """`base`, or `base_1`, `base_2`, ... : the first not in `names` (which then holds it)."""
    name, i = base, 1
    while name in names:
        name, i = f"{base}_{i}", i + 1
    names.add(name)
    return name


def new_constant(g: Graph, names: set[str], base: str, array: np.ndarray) -> Value:
    """A fresh initializer of g holding `array`; `names` (from value_names) holds the taken ones."""
    name = fresh_name(names, base)
    v = Value(name, const=Tensor.from_numpy(name, c_order(array)))
    g.initializers[name] = v
    return v


def value_names(g: Graph) -> set[str]:
    names = {v.name for v in g.inputs} | set(g.initializers)
    for n in g.nodes:
        names.update(o.name for o in n.outputs)
    return names


def produce_in_place(x: Value, y: Value) -> None:
    """x's producer makes y in x's place (y keeps its name: a graph output that must stay one),
    and x's users read y; x is left without a producer. y's old producer must let it go."""
    x.replace_all_uses_with(y)
    p, i = x.producer, x.output_index
    p.outputs[i], y.producer, y.output_index = y, p, i
    x.producer = None


def hand_over_output(frm: Node, to: Node) -> None:
    """`to`, whose output 0 fed only `frm`, now produces frm's output 0 (the value keeps its
    name, type and uses); `frm` is left with an unused stand-in, for Graph.remove_nodes."""
    y, old = frm.outputs[0], to.outputs[0]
    to.outputs[0] = y
    y.producer, y.output_index = to, 0
    old.producer = None
    stand_in = Value(f"{y.name}__folded")
    stand_in.producer, stand_in.output_index = frm, 0
    frm.outputs[0] = stand_in


def set_bias(n: Node, v: Value) -> None:
    """Input 2 (the optional bias of Conv/ConvTranspose/Gemm) becomes v."""
    if len(n.inputs) > 2:
        n.set_input(2, v)
    else:
        n._append_input(v)


def shape(v: Value | None) -> tuple | None:
    """The value's dims when its type is a tensor of known rank, else None."""
    t = getattr(v, "type", None)
    return tuple(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def is_float32(v: Value | None) -> bool:
    t = getattr(v, "type", None)
    return t is not None and getattr(t, "elem_type", None) == DataType.FLOAT


def channel_vector(a: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts against [N, C, ...] (rank `rank`) as one value per channel C:
    shape (), (1,), [C, 1, ...] or [1, C, 1, ...]; returns it as a [C] vector."""
    if a.size == 1:
        return np.full(channels, a.reshape(-1)[0], a.dtype)
    shape = list(a.shape)
    while len(shape) < rank:
        shape.insert(0, 1)
    if len(shape) != rank or shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return a.reshape(channels)


def clip_bounds(n: Node) -> tuple[float, float] | None:
    """(min, max) of a Clip whose bounds are constants (attributes before opset 11, inputs
    since; an omitted bound is -inf/+inf), else None."""
    if "min" in n.attributes or "max" in n.attributes or len(n.inputs) == 1:
        lo, hi = n.attributes.get("min"), n.attributes.get("max")
        return (lo.value if lo else -np.inf, hi.value if hi else np.inf)
    bounds = []
    for i, default in ((1, -np.inf), (2, np.inf)):
        v = n.inputs[i] if len(n.inputs) > i else None
        if v is None:
            bounds.append(default)
            continue
        a = const(v)
        if a is None or a.size != 1:
            return None
        bounds.append(float(a.reshape(-1)[0]))
    return bounds[0], bounds[1]
