"""The IR as text, one line per node (for --print-ir-after and the golden IR dumps)."""

from __future__ import annotations

from .dims import format_shape
from .graph import Graph, Model, Value
from .types import DataType, TensorType


def _value(v: Value | None) -> str:
    if v is None:
        return "_"
    t = v.type
    c = v.const
    if c is not None and hasattr(c, "dims"):
        return f"%{v.name}: {DataType(c.dtype).name.lower()}[{', '.join(map(str, c.dims))}]"
    if isinstance(t, TensorType):
        return f"%{v.name}: {DataType(t.elem_type).name.lower()}{format_shape(t.shape)}"
    return f"%{v.name}"


def _attr(a) -> str:  # noqa: ANN001 - ir.Attribute
    v = a.value
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    if isinstance(v, Graph):
        return f"{a.name}=<graph {v.name}>"
    if isinstance(v, (list, tuple)) and len(v) > 8:
        v = f"[{', '.join(map(str, v[:8]))}, ... {len(v)} values]"
    return f"{a.name}={v}"


def print_graph(g: Graph, indent: str = "") -> list[str]:
    lines = [f"{indent}graph {g.name or '(main)'}(" + ", ".join(_value(v) for v in g.inputs) + ")"]
    consts = [v for v in g.initializers.values()]
    if consts:
        lines.append(f"{indent}  weights: " + ", ".join(_value(v) for v in consts[:16])
                     + (f", ... {len(consts)} in all" if len(consts) > 16 else ""))
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
