"""Remove no-op nodes."""

from __future__ import annotations

import struct

import numpy as np

from mcp_compiler.ir import DataType, Node, TensorType, Value

from .. import _rewrite as R
from .._infra import ALL, Property
from .._rules import FnRule, RewriteContext, RuleSetPass


class IdentityEliminationPass(RuleSetPass):
    """Rules, each y -> x for every consumer of y:

    - Identity(x) -> x
    - Dropout(x) -> x when its mask output is unused and training_mode is absent or a constant
      false (inference)
    - Cast(x, to=T) -> x when x is already of type T
    - Transpose(x, perm) -> x when perm is the identity permutation
    - Slice(x, starts, ends, axes, steps) -> x when it takes everything: constant starts of 0,
      steps of 1, and ends at or past the dim (or at least 2^31 - 1, "to the end" as exporters
      write it, where the dim is not known)

    and one rule on inputs: an LSTM's, GRU's, RNN's (or onnxruntime's DynamicQuantizeLSTM's)
    initial state (initial_h, initial_c) that is all zeros (a zero constant, or ConstantOfShape of
    0, through Slices, Reshapes and other ops that only pick or move elements) is dropped: zeros
    are its default.

    When y is a graph output (the interface keeps its names), x's producer makes y instead and
    x's other consumers read y; not applied when x is a graph input, a constant, a graph output
    itself or made in an enclosing graph.
    """

    name = "identity-elimination"
    requires = frozenset()
    establishes = frozenset()
    # a dropped Slice or zero state leaves its constants unused (found by --verify-each's
    # preserved-property check): dead-code elimination runs after it
    preserves = ALL - {Property.NO_DEAD_CODE}


def _noop(n: Node, rc: RewriteContext):  # noqa: ANN202
    """(x, how): n passes x through unchanged; how "uses" (y's users read x) or "take-over"
    (y is a graph output: x's producer makes y); else why not."""
    ins = n._inputs
    if not ins or ins[0] is None or not n.is_onnx():
        return "no first input"
    # (Add, Mul and the like are no-ops when they keep an operand: found once)
    x = _kept_operand(n) if n.op_type in _NEUTRAL else ins[0] if _is_noop(n) else None
    if x is None:
        return "not a no-op"
    y = n.outputs[0]
    if any(rc.is_output(o) for o in n.outputs[1:]):
        return "its second output is a graph output"
    if y.type is not None and x.type is not None and y.type != x.type and n.op_type not in ("Identity", "Slice", *_NEUTRAL):
        return f"{y.name}'s type differs from {x.name}'s"
    if not rc.is_output(y):
        return x, "uses"
    here = rc.memo.get("here")
    if here is None:
        here = rc.memo["here"] = {id(m) for m in rc.graph.nodes}
    if x.producer is not None and id(x.producer) in here and not rc.is_output(x):
        return x, "take-over"
    return f"{y.name} is a graph output and {x.name} cannot be made in its place"


def _drop(n: Node, found, rc: RewriteContext) -> None:  # noqa: ANN001
    x, how = found
    y = n.outputs[0]
    if how == "uses":
        rc.replace_value(y, x)
    else:
        _take_over(n, x, y)
        rc.changed(y.producer)
    rc.erase(n)


def _zero_states(n: Node, rc: RewriteContext):  # noqa: ANN202
    key = n.op_type if n.is_onnx() else f"{n.domain}.{n.op_type}"
    zeros = [i for i in _STATES.get(key, ()) if i < len(n.inputs) and _all_zeros(n.inputs[i])]
    return zeros[0] if zeros else "no initial state that is all zeros"


def _drop_zero_state(n: Node, i: int, rc: RewriteContext) -> None:
    rc.set_input(n, i, None)   # (the node is looked at again: its other state next)


_RULES = (FnRule("nodes_removed", frozenset({"Identity", "Dropout", "Cast", "Transpose", "Slice", "Add", "Sub",
                                              "Mul", "Div"}), _noop, _drop),
          FnRule("zero_states_dropped", frozenset({"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"}), _zero_states,
                 _drop_zero_state))
IdentityEliminationPass.rounds = (_RULES,)


def _is_noop(n: Node) -> bool:
    """n passes its first input through unchanged (the ops of _NEUTRAL: _kept_operand)."""
    op = n.op_type
    if op == "Identity":
        return len(n.outputs) == 1
    if op == "Dropout":
        if len(n.outputs) > 1 and n.outputs[1].uses:
            return False
        if len(n.inputs) >= 3 and n.inputs[2] is not None:
            t = n.inputs[2].const
            return t is not None and not getattr(t, "string_data", None) and not bool(t.numpy().any())
        return "is_test" not in n.attributes or n.attributes["is_test"].value == 1
    if op == "Cast":
        x = n.inputs[0]
        to = n.attributes.get("to")
        return (to is not None and isinstance(x.type, TensorType) and not x.type.sparse
                and int(x.type.elem_type) == to.value and "saturate" not in n.attributes)
    if op == "Transpose":
        perm = n.attributes.get("perm")
        return perm is not None and list(perm.value) == list(range(len(perm.value))) and len(n.outputs) == 1
    if op == "Slice":
        return len(n.outputs) == 1 and _takes_everything(n)
    return False


_NEUTRAL = {"Add": (0, True), "Sub": (0, False), "Mul": (1, True), "Div": (1, False)}   # element, commutes


def _kept_operand(n: Node) -> Value | None:
    """The operand a node of _NEUTRAL's ops passes through, x of Add(x, 0) and the like, or None."""
    ins = n._inputs
    if len(ins) != 2 or ins[0] is None or ins[1] is None:
        return None
    element, commutes = _NEUTRAL[n.op_type]
    for x, c in ((ins[0], ins[1]), (ins[1], ins[0]))[:2 if commutes else 1]:
        if _other_scalar(c, element):
            continue
        a = R.const(c)
        shape = R.shape(x)
        if a is None or shape is None or a.ndim > len(shape) or a.size == 0 or not (a == element).all():
            continue
        if not isinstance(x.type, TensorType) or int(c.const.dtype) != int(x.type.elem_type):
            continue
        if all(d == 1 or d == shape[len(shape) - a.ndim + i] for i, d in enumerate(a.shape)):
            return x
    return None


def _other_scalar(c: Value, element: int) -> bool:
    """c is a float32 constant of one element that is not `element` (read from its 4 bytes: most
    Muls and Adds of a network are by such a constant, and none of them is a no-op)."""
    t = c.const
    if t is None or getattr(t, "dtype", None) != DataType.FLOAT or len(t.dims) > 1 or (t.dims and t.dims[0] != 1):
        return False
    v = struct.unpack("<f", t.raw)[0]
    return v != element


TO_THE_END = 2**31 - 1


def _takes_everything(n: Node) -> bool:
    """A Slice whose every sliced axis starts at 0, steps by 1 and ends at or past the dim."""
    if len(n.inputs) >= 3:   # opset 10 on: starts, ends, axes, steps are inputs
        ins = [*n.inputs, None, None][1:5]
        starts, ends, axes, steps = (R.const(v) for v in ins)
        if starts is None or ends is None or (ins[2] is not None and axes is None) or (
                ins[3] is not None and steps is None):
            return False
    else:                    # opset 1-9: attributes
        attr = {k: a.value for k, a in n.attributes.items()}
        if "starts" not in attr or "ends" not in attr:
            return False
        starts, ends, axes, steps = attr["starts"], attr["ends"], attr.get("axes"), None
    starts, ends = [int(s) for s in np.ravel(starts)], [int(e) for e in np.ravel(ends)]
    steps = [1] * len(starts) if steps is None else [int(s) for s in np.ravel(steps)]
    x = n.inputs[0].type
    shape = x.shape if isinstance(x, TensorType) else None
    if axes is None:
        axes = list(range(len(starts)))
    for axis, start, end, step in zip(np.ravel(axes), starts, ends, steps):
        dim = shape[int(axis)] if shape is not None and -len(shape) <= int(axis) < len(shape) else None
        if start != 0 or step != 1:
            return False
        if not (end >= TO_THE_END or (isinstance(dim, int) and end >= dim)):
            return False
    return len(starts) == len(ends) == len(steps)


# initial_h, initial_c (onnxruntime's int8 LSTM takes them where LSTM does)
_STATES = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,), "com.microsoft.DynamicQuantizeLSTM": (5, 6)}


_PICKS = ("Slice", "Reshape", "Transpose", "Expand", "Unsqueeze", "Squeeze", "Gather", "Flatten", "Identity")


def _all_zeros(v: Value | None) -> bool:
    while v is not None and v.producer is not None and v.producer.is_onnx(*_PICKS):
        v = v.producer.inputs[0]
    if v is None:
        return False
    a = R.const(v)
    if a is not None:
        return not a.any()
    p = v.producer
    if p is None or not p.is_onnx("ConstantOfShape"):
        return False
    value = p.attributes.get("value")
    return value is None or not value.value.numpy().any()


def _take_over(n: Node, x: Value, y: Value) -> None:
    """x's producer makes the graph output y (n's result) in x's place; n is left unlinked."""
    for i in range(len(n.inputs)):
        n.set_input(i, None)
    R.produce_in_place(x, y)
    n.outputs = [Value(f"{y.name}__eliminated")]
    n.outputs[0].producer = n
