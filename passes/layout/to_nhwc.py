"""NHWC interface: 4-D image inputs and outputs become channels-last; transposes move and cancel."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import Attribute, AttrType, Graph, Layout, Model, Node, TensorType, Value

from .._infra import Pass, PassContext, PassResult, Property
from .._rewrite import const, fresh_name, new_constant, value_names

TO_NCHW, TO_NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
ORIGINAL_LAYOUT = "mcp:original_layout"   # on an interface value already NHWC in the original

# Ops that read an NCHW tensor's axes as N, C, spatial: what makes a 4-D value an image.
SPATIAL = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
           "GlobalMaxPool", "GlobalLpPool", "BatchNormalization", "InstanceNormalization", "LRN",
           "Resize", "Upsample", "DepthToSpace", "SpaceToDepth", "GroupNormalization", "MaxUnpool"}
# Elementwise ops a transpose commutes with: op(T(x)) = T(op(x)).
UNARY = {"Abs", "Acos", "Asin", "Atan", "Cast", "Ceil", "Celu", "Clip", "Cos", "Elu", "Erf", "Exp",
         "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu",
         "Log", "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign",
         "Sin", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu"}
BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu", "Equal", "Greater", "Less",
          "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Mod"}
_SEARCH = 32   # how far (in agnostic ops) an input may be from the op that makes it an image


def perm_of(n: Node) -> list[int] | None:
    a = n.attributes.get("perm")
    return list(a.value) if a is not None else None


def is_transpose(n: Node | None, perm: list[int] | None = None) -> bool:
    return (n is not None and n.op_type == "Transpose" and n.is_onnx()
            and (perm is None or perm_of(n) == perm))


def _rank4(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.shape is not None and len(v.type.shape) == 4


def _reaches_spatial_down(v: Value) -> bool:
    """v reaches an op that reads it as NCHW through elementwise ops and transposes that
    compose to the identity."""
    frontier, seen = [(v, [0, 1, 2, 3])], set()
    for _ in range(_SEARCH):
        nxt = []
        for x, perm in frontier:
            for n, _i in x.uses:
                if not n.is_onnx() or id(n) in seen:
                    continue
                seen.add(id(n))
                if n.op_type in SPATIAL and perm == [0, 1, 2, 3]:
                    return True
                if n.op_type in UNARY or n.op_type in BINARY:
                    nxt.append((n.outputs[0], perm))
                elif is_transpose(n) and perm_of(n) is not None and len(perm_of(n)) == 4:
                    nxt.append((n.outputs[0], [perm[p] for p in perm_of(n)]))
        if not nxt:
            return False
        frontier = nxt
    return False


def _reaches_spatial_up(v: Value) -> bool:
    x = v
    for _ in range(_SEARCH):
        n = x.producer
        if n is None or not n.is_onnx():
            return False
        if n.op_type in SPATIAL:
            return True
        if n.op_type not in UNARY and n.op_type not in BINARY:
            return False
        x = next((i for i in n.inputs if i is not None and i.const is None and _rank4(i)), None)
        if x is None:
            return False
    return False


def _permuted(t: TensorType, perm: list[int]) -> TensorType:
    return TensorType(t.elem_type, tuple(t.shape[p] for p in perm), None, t.denotation, t.sparse)


class LayoutNhwcPass(Pass):
    """The model's 4-D image interface becomes NHWC (`--layout nhwc`):

    - an image input x (4-D, reaching Conv/Pool/BatchNorm/Resize/... through elementwise ops)
      is declared [N, H, W, C] and feeds `Transpose(x, [0, 3, 1, 2])` into the unchanged graph;
      an input that already feeds only `Transpose(x, [0, 3, 1, 2])` is NHWC already: marked
    - an image output y (4-D, made by such an op through elementwise ops) becomes
      `Transpose(y, [0, 2, 3, 1])`, keeping its name
    - transposes then move down through elementwise ops (op(T(x)) -> T(op(x)), a constant
      operand permuted to match), and T(T(x)) merge: cancel to x when they compose to identity
    - the contract is recorded on the interface values (Value.layout = NHWC) and in Triton's
      config (input `format`, the `mcp_layouts` parameter), which verify reads

    Inner tensors stay NCHW: onnxruntime's Conv kernels want NCHW (they pick their own blocked
    layout inside).
    """

    name = "layout-nhwc"
    requires = frozenset()
    establishes = frozenset({Property.LAYOUT_NHWC})
    preserves = frozenset({Property.NO_CONSTANT_NODES, Property.NO_DEAD_CODE})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        g = model.graph
        names = value_names(g)
        converted_in, converted_out, already, skipped = [], [], [], []
        for i, x in enumerate(list(g.inputs)):
            if x.const is not None or not _rank4(x):
                continue
            if x.uses and all(is_transpose(n, TO_NCHW) for n, _ in x.uses):
                x.layout = Layout.NHWC
                x.metadata_props[ORIGINAL_LAYOUT] = "NHWC"   # the original's too: verify feeds it as is
                already.append(x.name)
            elif _reaches_spatial_down(x):
                converted_in.append(x.name)
                g.inputs[i] = _nhwc_input(g, x, names)
            else:
                skipped.append(f"{x.name}: no Conv/Pool/... reads it as NCHW")
        for i, y in enumerate(list(g.outputs)):
            if y.layout == Layout.NHWC or not _rank4(y) or not _reaches_spatial_up(y):
                continue
            if y in g.inputs:
                continue
            converted_out.append(y.name)
            g.outputs[i] = _nhwc_output(g, y, names)
        moved = cancelled = 0
        if (converted_in or converted_out) and not any(True for n in g.nodes for _ in n.subgraphs()):
            moved, cancelled = _optimize(g, names)   # (subgraphs read outer values: order kept)
        return PassResult(model, bool(converted_in or converted_out or already), stats={
            "inputs": converted_in, "outputs": converted_out, "already_nhwc": already,
            "skipped": skipped, "transposes_moved": moved, "transposes_cancelled": cancelled})


def _nhwc_input(g: Graph, x: Value, names: set[str]) -> Value:
    """A new graph input named like x, NHWC; x (kept for its uses) is now its transpose."""
    new = Value(x.name, _permuted(x.type, TO_NHWC), layout=Layout.NHWC)
    new.doc_string, new.metadata_props = x.doc_string, dict(x.metadata_props)
    x.name = fresh_name(names, f"{x.name}__nchw")
    x.layout = Layout.NCHW
    g.nodes.insert(0, Node("Transpose", [new], [x], name=fresh_name(names, f"{new.name}__to_nchw"),
                           attributes=[Attribute("perm", AttrType.INTS, TO_NCHW)]))
    g.value_info.pop(new.name, None)
    return new


def _nhwc_output(g: Graph, y: Value, names: set[str]) -> Value:
    """A new graph output named like y, the NHWC transpose of y (renamed)."""
    new = Value(y.name, _permuted(y.type, TO_NHWC), layout=Layout.NHWC)
    new.doc_string, new.metadata_props = y.doc_string, dict(y.metadata_props)
    y.name = fresh_name(names, f"{y.name}__nchw")
    y.layout = Layout.NCHW
    g.value_info.pop(new.name, None)
    g.nodes.append(Node("Transpose", [y], [new], name=fresh_name(names, f"{new.name}__to_nhwc"),
                        attributes=[Attribute("perm", AttrType.INTS, TO_NHWC)]))
    return new


def _optimize(g: Graph, names: set[str]) -> tuple[int, int]:
    """Move transposes down through elementwise ops and merge/cancel the ones that meet."""
    outputs = {id(v) for v in g.outputs}
    moved = cancelled = 0
    work = [n for n in g.nodes if is_transpose(n)]
    dead: list[Node] = []
    while work:
        t = work.pop()
        y = t.outputs[0]
        if t.inputs[0] is None or id(y) in outputs or len(y.uses) != 1 or perm_of(t) is None:
            continue
        n, index = y.uses[0]
        if is_transpose(n) and perm_of(n) is not None:
            composed = [perm_of(t)[p] for p in perm_of(n)]
            x = t.inputs[0]
            if composed == sorted(composed) and id(n.outputs[0]) not in outputs:
                n.outputs[0].replace_all_uses_with(x)
                dead += [n, t]
                cancelled += 2
            else:
                n.set_input(0, x)
                n.attributes["perm"] = Attribute("perm", AttrType.INTS, composed)
                dead.append(t)
                cancelled += 1
                work.append(n)
            continue
        if not n.is_onnx() or len(n.outputs) != 1 or id(n.outputs[0]) in outputs:
            continue
        if n.op_type in UNARY and index == 0:
            pass
        elif n.op_type in BINARY and _constant_operands_permutable(n, index, perm_of(t), g, names):
            pass
        else:
            continue
        swap_below(t, n, names)
        moved += 1
        work.append(t)
    g.remove_nodes(dead)
    toposort(g)
    return moved, cancelled


def _constant_operands_permutable(n: Node, index: int, perm: list[int], g: Graph, names: set[str]) -> bool:
    """For op(T(x), c): replace each constant c by its inverse-permuted copy (so that
    op(x, c') transposed equals op(T(x), c)); False when another operand is not a constant."""
    rank = len(perm)
    new = {}
    for j, v in enumerate(n.inputs):
        if j == index or v is None:
            continue
        a = const(v)
        if a is None or a.ndim > rank:
            return False
        if a.size == 1 and a.ndim <= 1:
            continue
        new[j] = transposed_back(a, perm)
    for j, arr in new.items():
        n.set_input(j, new_constant(g, names, f"{n.inputs[j].name}__nchw", arr))
    return True


def transposed_back(a: np.ndarray, perm: list[int]) -> np.ndarray:
    """The constant c' with op(x, c') transposed by `perm` equal to op(T(x), c): c broadcast to
    the rank of perm, then transposed by perm's inverse."""
    inverse = [perm.index(i) for i in range(len(perm))]
    return np.transpose(a.reshape((1,) * (len(perm) - a.ndim) + a.shape), inverse)


def swap_below(t: Node, n: Node, names: set[str]) -> None:
    """op(T(x)) -> T(op(x)): n reads x and makes a fresh value; t transposes that into n's old
    output value (which keeps its name and uses)."""
    x, y, o = t.inputs[0], t.outputs[0], n.outputs[0]
    index = next(i for i, v in enumerate(n.inputs) if v is y)
    n.set_input(index, x)
    inner_type = None
    if isinstance(o.type, TensorType) and o.type.shape is not None:
        inverse = [perm_of(t).index(i) for i in range(len(o.type.shape))]
        inner_type = _permuted(o.type, inverse)
    z = Value(fresh_name(names, f"{o.name}__pre"), inner_type)
    z.producer, z.output_index = n, 0
    n.outputs[0] = z
    t.set_input(0, z)
    o.producer, o.output_index = t, 0
    t.outputs[0] = o
    y.producer = None


def toposort(g: Graph) -> None:
    """Reorder g.nodes topologically, keeping the present order where it already is one."""
    ready_values = {id(v) for v in g.inputs} | {id(v) for v in g.initializers.values()} \
        | {id(v) for v in g.sparse_initializers.values()}
    pending: dict[int, int] = {}
    waiting: dict[int, list[Node]] = {}
    order: list[Node] = []
    stack: list[Node] = []
    for n in g.nodes:
        need = {id(v) for v in n.inputs if v is not None and v.producer is not None}
        need -= ready_values
        pending[id(n)] = len(need)
        for v in need:
            waiting.setdefault(v, []).append(n)
    by_order = list(g.nodes)
    done: set[int] = set()

    def release(n: Node) -> None:
        order.append(n)
        done.add(id(n))
        for o in n.outputs:
            for m in waiting.pop(id(o), []):
                pending[id(m)] -= 1
                if pending[id(m)] == 0:
                    stack.append(m)

    for n in by_order:
        if pending[id(n)] == 0 and id(n) not in done:
            stack.append(n)
            while stack:
                m = stack.pop()
                if id(m) not in done:
                    release(m)
    g.nodes = order + [n for n in by_order if id(n) not in done]
