"""The IR as text, one line per node (for --print-ir-after, the golden IR dumps and the IR-text
tests, which read it back with `ir.parser.parse_model`).

    model (opsets ai.onnx:17)
    graph g(%x: float[N, 4])
      weight %w: float[4, 3]
      weight %lo: float[] = [0.5]
      %y: float[N, 3] = MatMul(%x: float[N, 4], %w: float[4, 3])
      %z: float[N, 3] = Max(%y: float[N, 3], %lo: float[]) {}
      return %z: float[N, 3]

Weights of up to 8 elements show their values; attributes print as `name=value` (ints, floats,
"strings", lists of them, `tensor(float[1], [0])`, `<graph NAME>` with the graph printed below
its node).
"""

from __future__ import annotations

import json

import numpy as np

from .dims import PLAIN_NAME, format_shape
from .graph import Graph, Model, Value
from .tensor import Tensor
from .types import DataType, TensorType

SHOWN_VALUES = 8   # weights (and tensor attributes) of at most this many elements show their values


def _value(v: Value | None) -> str:
    if v is None:
        return "_"
    t = v.type
    c = v.const
    if c is not None and hasattr(c, "dims"):
        return f"%{v.name}: {DataType(c.dtype).name.lower()}[{', '.join(map(str, c.dims))}]"
    if isinstance(t, TensorType):
        return f"%{v.name}: {DataType(t.elem_type).name.lower()}{format_shape(t.shape, quote=True)}"
    return f"%{v.name}"


def _values(t: Tensor) -> str | None:
    """The tensor's elements as a flat list, when it is small and numeric."""
    if t.string_data is not None or t.dtype.packed or int(np.prod(t.dims, dtype=np.int64)) > SHOWN_VALUES:
        return None
    try:
        a = t.numpy()
    except (TypeError, ValueError):
        return None
    if a.dtype.kind not in "biuf":
        return None
    return "[" + ", ".join(_scalar(x) for x in a.reshape(-1)) + "]"


def _scalar(x) -> str:  # noqa: ANN001 - numpy scalar
    if isinstance(x, (np.bool_, bool)):
        return "true" if x else "false"
    if isinstance(x, np.integer):
        return str(int(x))
    text = str(x)   # numpy's shortest repr that reads back to the same float of that width
    return text if any(c in text for c in ".ein") else text + ".0"


def _weight(v: Value) -> str:
    shown = _values(v.const) if isinstance(v.const, Tensor) else None
    return _value(v) + (f" = {shown}" if shown is not None else "")


def _attr_value(v) -> str:  # noqa: ANN001
    if isinstance(v, bytes):
        return json.dumps(v.decode(errors="replace"))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, Graph):
        return f"<graph {_graph_name(v)}>"
    if isinstance(v, Tensor):
        shown = _values(v)
        return f"tensor({DataType(v.dtype).name.lower()}[{', '.join(map(str, v.dims))}]" \
               + (f", {shown})" if shown is not None else ")")
    if isinstance(v, (list, tuple)):
        if len(v) > SHOWN_VALUES and not any(isinstance(x, Graph) for x in v):
            return f"[{', '.join(_attr_value(x) for x in v[:SHOWN_VALUES])}, ... {len(v)} values]"
        return "[" + ", ".join(_attr_value(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _attr(a) -> str:  # noqa: ANN001 - ir.Attribute
    return f"{a.name}={_attr_value(a.value)}"


def _graph_name(g: Graph) -> str:
    if not g.name:
        return "(main)"
    return g.name if PLAIN_NAME.fullmatch(g.name) else json.dumps(g.name)


def print_graph(g: Graph, indent: str = "") -> list[str]:
    lines = [f"{indent}graph {_graph_name(g)}(" + ", ".join(_value(v) for v in g.inputs) + ")"]
    lines += [f"{indent}  weight {_weight(v)}" for v in g.initializers.values()]
    for n in g.nodes:
        dom = f"{n.domain}." if not n.is_onnx() else ""
        attrs = ", ".join(_attr(a) for a in n.attributes.values())
        lines.append(f"{indent}  {', '.join(_value(o) for o in n.outputs)} = {dom}{n.op_type}"
                     f"({', '.join(_value(i) for i in n.inputs)}){' {' + attrs + '}' if attrs else ''}")
        for sub in n.subgraphs():
            lines += print_graph(sub, indent + "    ")
    lines.append(f"{indent}  return " + ", ".join(_value(v) for v in g.outputs))
    return lines


def print_model(model: Model) -> str:
    opsets = ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in sorted(model.opset_imports.items()))
    return "\n".join([f"model (opsets {opsets})", *print_graph(model.graph)]) + "\n"
