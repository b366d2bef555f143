"""Evaluate nodes whose inputs are all constants, once, with onnxruntime."""

from __future__ import annotations

import hashlib

import numpy as np

from mcp_compiler.ir import AttrType, DataType, Graph, Model, Node, Tensor, TensorType
from mcp_compiler.ir.tensor import INTEGER_TYPES, PARAMETER_BYTES

from .. import _rewrite as R
from .._infra import ALL, Pass, PassContext, PassResult, Property

_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                     "Multinomial", "Bernoulli", "Dropout"}


class FoldConstantsPass(Pass):
    """op(c1, c2, ...) -> c, for nodes whose inputs are all constants (or folded already), and
    Shape(x) -> c when x's shape is fully known; in the main graph and in every subgraph (If
    branches, Loop and Scan bodies: constants of the graphs around them are constants there).

    A graph's foldable nodes are evaluated in one onnxruntime session (the runtime the target runs
    on, so folded values are the ones it would compute); a set of data-movement ops only (Reshape,
    Squeeze, Unsqueeze, Flatten, Identity, integer Casts) is moved in numpy, which computes the
    same bytes, without a session. Not applied to random ops, nodes with
    subgraphs, non-default domains, values that are graph outputs, results of a dtype numpy cannot
    hold, or results bigger than the constants they replace (a result other than a small integer is
    stored only where the constants it is made from go with it: the weights never grow; a model
    that generates its weights with ConstantOfShape or Tile keeps generating them unless
    --fold-size-limit MB lets results up to that size be stored: see _storable); and not to
    compressed weights' own decompression (DequantizeLinear of int8/int4/float8 weights, a Cast of
    float16/int8 weights to a wider float): the model's weights never get bigger than the
    input's. If onnxruntime cannot evaluate a graph's set, nothing of it is folded and the stats
    say so.
    """

    name = "fold-constants"
    requires = frozenset()
    establishes = frozenset()
    preserves = ALL - {Property.NO_DEAD_CODE, Property.UNIQUE_WEIGHTS}
    idempotent = True

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        # Outer graphs first: what folds there is a constant in the subgraphs inside.
        known: set[int] = set()
        results: dict[int, np.ndarray] = {}
        plans: list[tuple[Graph, list[Node], list, list]] = []
        stats: dict[str, object] = {"nodes_folded": 0, "values_replaced": 0}
        for g in list(model.graph.graphs()):
            known.update(id(v) for v in g.initializers.values())
            fold = _foldable(g, known)
            if not fold:
                continue
            folded = {id(n) for n in fold}
            outputs = {id(v) for v in g.outputs}
            wanted = [o for n in fold for o in n.outputs if o.name and id(o) not in outputs
                      and any(id(u) not in folded for u, _ in o.uses)]
            try:
                values = _evaluate(model, g, fold, wanted, results)
            except Exception as e:  # noqa: BLE001 - reported in the stats, that graph stays as it was
                known.difference_update(id(o) for n in fold for o in n.outputs)
                stats["not_folded_runtime_error"] = int(stats.get("not_folded_runtime_error", 0)) + 1
                stats.setdefault("error", str(e).splitlines()[0][:200])
                continue
            results.update(zip(map(id, wanted), values))
            plans.append((g, fold, wanted, values))
        every = [n for _, fold, _, _ in plans for n in fold]
        inputs = {id(v) for g in model.graph.graphs() for v in g.inputs}   # an initializer that is an input stays
        storable = _storable(every, {id(n) for n in every}, [v for p in plans for v in p[2]],
                             [a for p in plans for a in p[3]], ctx.fold_size_limit, inputs)
        for g, fold, wanted, values in plans:
            stats["values_replaced"] += _replace(g, wanted, values, storable)
            stats["nodes_folded"] += _drop_unused(g, fold)
        return PassResult(model, stats["values_replaced"] > 0, stats)


def _foldable(g: Graph, known: set[int]) -> list[Node]:
    """The nodes of g that can be evaluated now (adds their outputs to `known`)."""
    fold: list[Node] = []
    for n in g.nodes:
        if not n.is_onnx() or n.op_type in _NONDETERMINISTIC:
            continue
        if n.attributes and any(a.type in (AttrType.GRAPH, AttrType.GRAPHS) or a.ref_attr_name
                                for a in n.attributes.values()):
            continue
        if n.op_type == "Shape" and _static_shape(n) is not None and not n.attributes:
            fold.append(n)
            known.update(id(o) for o in n.outputs)
            continue
        some = False   # every input given is known (most nodes: the first is not)
        for v in n._inputs:
            if v is None:
                continue
            if id(v) not in known:
                break
            some = True
        else:
            if some and n.op_type != "Constant" and not _expands_weights(n):
                fold.append(n)
                known.update(id(o) for o in n.outputs)
    return fold


def _replace(g: Graph, wanted: list, values: list, storable: set[int]) -> int:
    replaced = 0
    for v, arr in zip(wanted, values):
        if arr.dtype.type.__module__ != "numpy" or arr.dtype == object or id(v) not in storable:
            continue
        producer = v.producer
        uses = list(v.uses)
        v.uses.clear()
        v.const = Tensor.from_numpy(v.name, R.c_order(arr))   # a scalar stays a scalar
        v.uses.extend(uses)
        # The value is now a constant: its producer no longer defines it.
        if producer is not None:
            producer.outputs[v.output_index] = _orphan(v, producer, v.output_index)
        v.producer, v.output_index = None, -1
        g.initializers[v.name] = v
        replaced += 1
    return replaced


def _drop_unused(g: Graph, fold: list[Node]) -> int:
    """Folded nodes none of whose outputs is still used go (dead-code-elimination would too)."""
    outputs = {id(v) for v in g.outputs}
    dead = []
    for n in reversed(fold):  # back to front: detaching a node may free its producers
        if all(not o.uses and id(o) not in outputs for o in n.outputs):
            n.detach()
            dead.append(n)
    g.remove_nodes(dead)
    return len(dead)


def _shape_like(arr: np.ndarray) -> bool:
    """A small integer or bool result (shape arithmetic, indices, conditions): stored whatever it
    is made from. A small float is a weight like any other (ConstantOfShape of one value makes
    a model's weights at run time: storing them grows the file)."""
    return arr.nbytes <= PARAMETER_BYTES and arr.dtype.kind in "biu"   # (an array's Tensor.is_parameter)


def _storable(fold: list[Node], folded: set[int], wanted: list, values: list, limit: int | None,
              kept: set[int] = frozenset()) -> set[int]:
    """Which folded results may be stored (ids of `wanted` values).

    By default the weights never grow: integer and bool results of at most 64 bytes always fold
    (shape-like values); others fold by connected group of folded nodes, all or none, where the
    group's stored results take no more bytes than the constants that only the group reads (they
    go with it; not an initializer that is also a graph input, in `kept`: the interface keeps
    it): Slices of one packed weight and the Concat that reorders them fold together, a weight
    generated by ConstantOfShape or Tile stays generated. With --fold-size-limit, any result up
    to that size, or not larger than its producer's constant inputs.
    """
    if limit is not None:
        ok = set()
        for v, arr in zip(wanted, values):
            ins = [x for x in (v.producer.inputs if v.producer is not None else ()) if x is not None and x.const is not None]
            if arr.nbytes <= limit or arr.nbytes <= sum(x.const.nbytes for x in ins):
                ok.add(id(v))
        return ok
    parent = {id(n): id(n) for n in fold}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    leaves: dict[int, tuple] = {}   # id(constant input) -> (value, a folded node reading it)
    for n in fold:
        for x in n.inputs:
            if x is None:
                continue
            if x.producer is not None and id(x.producer) in folded:
                parent[find(id(n))] = find(id(x.producer))
            elif x.const is not None:
                if id(x) in leaves:
                    parent[find(id(n))] = find(id(leaves[id(x)][1]))
                else:
                    leaves[id(x)] = (x, n)
    freed: dict[int, int] = {}
    for x, n in leaves.values():
        if id(x) not in kept and all(id(u) in folded for u, _ in x.uses):
            root = find(id(n))
            freed[root] = freed.get(root, 0) + x.const.nbytes
    stored: dict[int, dict[tuple, int]] = {}   # equal results count once: deduplicate-weights merges them
    for v, arr in zip(wanted, values):
        if not _shape_like(arr):
            key = (arr.dtype.str, arr.shape, hashlib.sha256(np.ascontiguousarray(arr).view(np.uint8)).digest())
            stored.setdefault(find(id(v.producer)), {})[key] = arr.nbytes
    return {id(v) for v, arr in zip(wanted, values)
            if _shape_like(arr) or sum(stored[find(id(v.producer))].values()) <= freed.get(find(id(v.producer)), 0)}


# What a compressed weight reads through: folding these would store the weight expanded.
_WIDER_FLOAT = {DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16, DataType.BFLOAT16}


def _expands_weights(n: Node) -> bool:
    """DequantizeLinear of a constant, or a Cast of a constant to a wider float type (int8 or
    float16 weights stored compressed, widened at run time): folding them makes the model's
    weights bigger than the input's, so the quantized-weight pattern stays as it is."""
    if n.op_type in ("DequantizeLinear", "DynamicQuantizeLinear"):
        return True
    if n.op_type != "Cast" or not n.inputs or n.inputs[0] is None or n.inputs[0].const is None:
        return False
    src = getattr(n.inputs[0].const, "dtype", None)
    to = DataType(n.attributes["to"].value) if "to" in n.attributes else None
    return src is not None and to in _WIDER_FLOAT and 0 < DataType(src).bits < to.bits


def _orphan(v, producer: Node, index: int):  # noqa: ANN001, ANN202
    """A fresh, unused stand-in for an output a producer loses to an initializer."""
    from mcp_compiler.ir import Value

    stand_in = Value(f"{v.name}__folded")
    stand_in.producer, stand_in.output_index = producer, index
    return stand_in


def _static_shape(n: Node) -> tuple[int, ...] | None:
    x = n.inputs[0] if n.inputs else None
    t = x.type if x is not None else None
    if isinstance(t, TensorType) and t.shape is not None and all(isinstance(d, int) for d in t.shape):
        return tuple(t.shape)
    return None


def _evaluate(model: Model, g: Graph, fold: list[Node], wanted: list,
              outer: dict[int, np.ndarray]) -> list[np.ndarray]:
    """The values of `wanted`, computed by `fold` from constants (and from `outer`: values of the
    graphs around g folded in this run, not yet stored). A set of data-movement ops only (a
    reshaped weight, a cast shape) is moved in numpy; anything else, or anything numpy refuses,
    runs in onnxruntime (an onnxruntime session costs 3-4 ms, a tenth of a small model's passes)."""
    moved = _move(fold, wanted, outer, model.onnx_opset)
    return moved if moved is not None else _run(model, g, fold, wanted, outer)


# The ops _move computes: bytes moved or reshaped, and casts of integers that are exact the same
# way in numpy and in onnxruntime (float sources are left to onnxruntime: NaN and out-of-range
# conversions, double rounding to float16).
_MOVES = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast", "Shape"}
_CAST_TO = INTEGER_TYPES | {DataType.FLOAT, DataType.DOUBLE}


def _move(fold: list[Node], wanted: list, outer: dict[int, np.ndarray], opset: int) -> list[np.ndarray] | None:
    """`_evaluate` in numpy when every node of `fold` is one of _MOVES; None otherwise."""
    if any(n.op_type not in _MOVES for n in fold):
        return None
    env: dict[int, np.ndarray] = {}

    def value(v) -> np.ndarray:  # noqa: ANN001 - a Value
        if id(v) in env:
            return env[id(v)]
        return v.const.numpy() if v.const is not None else outer[id(v)]

    try:
        for n in fold:
            static = _static_shape(n) if n.op_type == "Shape" and not n.attributes else None
            if static is not None:   # the Shape of a non-constant
                env[id(n.outputs[0])] = np.asarray(static, dtype=np.int64)
                continue
            ins = [value(v) if v is not None else None for v in n.inputs]
            env[id(n.outputs[0])] = _moved(n, ins, opset)
        return [np.array(env[id(v)]) for v in wanted]
    except (KeyError, ValueError, TypeError, IndexError):   # onnxruntime runs it, and says why if it fails
        return None


def _moved(n: Node, ins: list, opset: int) -> np.ndarray:
    attr = {k: a.value for k, a in n.attributes.items()}
    op, x = n.op_type, ins[0]
    if len(n.outputs) != 1 or x is None or (op == "Shape" and n.attributes):   # start/end: onnxruntime's
        raise ValueError(op)
    if op == "Shape":   # of a constant
        return np.asarray(x.shape, dtype=np.int64)
    if op == "Identity":
        return x
    if op == "Reshape":
        shape = [int(s) for s in ins[1]]
        if not attr.get("allowzero", 0):
            shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return x.reshape(shape)
    if op == "Flatten":
        axis = attr.get("axis", 1)
        axis = axis + x.ndim if axis < 0 else axis
        if not 0 <= axis <= x.ndim:
            raise ValueError(op)
        return x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))
    if op in ("Squeeze", "Unsqueeze"):
        axes = attr.get("axes") if opset < 13 else (ins[1] if len(ins) > 1 else None)
        if axes is None:
            if op == "Unsqueeze":
                raise ValueError(op)
            return np.squeeze(x)
        axes = tuple(int(a) for a in np.asarray(axes).reshape(-1))
        return np.squeeze(x, axis=axes) if op == "Squeeze" else np.expand_dims(x, axes)
    to = DataType(attr["to"])   # Cast
    if x.dtype.kind not in "biu" or to not in _CAST_TO:
        raise ValueError(op)
    return x.astype(to.numpy_dtype)


def _run(model: Model, g: Graph, fold: list[Node], wanted: list,
         outer: dict[int, np.ndarray]) -> list[np.ndarray]:
    """`_evaluate` in one onnxruntime session."""
    import onnxruntime as ort
    from onnx import helper

    from mcp_compiler.ir import Model as IRModel
    from mcp_compiler.ir import Value
    from mcp_compiler.lower import to_onnx

    sub = Graph("fold")
    mapping: dict[int, Value] = {}
    folded_outputs = {id(o) for n in fold for o in n.outputs}

    def local(v: Value) -> Value:
        if id(v) not in mapping:
            if id(v) in folded_outputs:
                mapping[id(v)] = Value(v.name)
            else:  # a constant input
                c = Value(v.name, const=v.const if v.const is not None else Tensor.from_numpy(v.name, outer[id(v)]))
                sub.initializers[v.name] = c
                mapping[id(v)] = c
        return mapping[id(v)]

    for n in fold:
        outs = [local(o) if o.name else Value("") for o in n.outputs]
        if n.op_type == "Shape" and _static_shape(n) is not None:
            shape = np.asarray(_static_shape(n), dtype=np.int64)
            o = outs[0]
            o.const = Tensor.from_numpy(o.name, shape)
            sub.initializers[o.name] = o
            continue
        sub.nodes.append(Node(n.op_type, [local(v) if v is not None else None for v in n.inputs], outs,
                              domain=n.domain, name=n.name, attributes=list(n.attributes.values())))
    sub.outputs = [mapping[id(v)] for v in wanted]
    proto = to_onnx(IRModel(sub, dict(model.opset_imports), ir_version=max(model.ir_version, 4)), value_info=True)
    for o in proto.graph.output:
        o.type.CopyFrom(helper.make_empty_tensor_value_info(o.name).type)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {})
