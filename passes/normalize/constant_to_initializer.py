"""Constant nodes become initializers."""

from __future__ import annotations

import numpy as np

from mcp_compiler.ir import AttrType, DataType, Model, Node, Tensor

from .._infra import ALL, Pass, PassContext, PassResult, Property

# Constant's attribute -> (dtype, rank) of the tensor it makes.
_SCALARS = {"value_float": (DataType.FLOAT, 0), "value_floats": (DataType.FLOAT, 1),
            "value_int": (DataType.INT64, 0), "value_ints": (DataType.INT64, 1),
            "value_string": (DataType.STRING, 0), "value_strings": (DataType.STRING, 1)}


class ConstantToInitializerPass(Pass):
    """Constant(value=t) -> initializer t, in every graph (subgraphs too).

    Rules: `value` (a tensor), `value_float(s)`, `value_int(s)`, `value_string(s)`. Not applied to
    `sparse_value`, to a Constant whose output is a graph output (the interface stays as it is),
    inside model-local function bodies (FunctionProto has no initializers), nor to models of IR
    version < 4 (there, initializers must also be graph inputs).
    Establishes: no-constant-nodes (for the forms above).
    """

    name = "constant-to-initializer"
    requires = frozenset()
    establishes = frozenset({Property.NO_CONSTANT_NODES})
    preserves = ALL - {Property.UNIQUE_WEIGHTS}
    idempotent = True

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        if model.ir_version < 4:
            return PassResult(model, False, {"skipped_ir_version_below_4": 1})
        moved = 0
        for g in model.graph.graphs():  # function bodies have no initializers
            outputs = {id(v) for v in g.outputs}
            done = []
            for n in g.nodes:
                if n.op_type != "Constant" or not n.is_onnx() or len(n.attributes) != 1:
                    continue
                out = n.outputs[0]
                if id(out) in outputs:
                    continue
                tensor = _tensor(n, out.name)
                if tensor is None:
                    continue
                uses = list(out.uses)
                out.uses.clear()
                n.detach()
                done.append(n)
                out.const = tensor
                out.output_index = -1
                out.uses.extend(uses)
                g.initializers[out.name] = out
                moved += 1
            g.remove_nodes(done)
        return PassResult(model, moved > 0, {"constants_moved": moved})


def _tensor(node, name: str) -> Tensor | None:  # noqa: ANN001
    (attr,) = node.attributes.values()
    if attr.ref_attr_name:
        return None
    if attr.name == "value" and attr.type == AttrType.TENSOR:
        t = attr.value
        moved = Tensor(name, t.dtype, t.dims, None if t.string_data is not None else t.raw,
                       string_data=t.string_data, doc_string=t.doc_string, metadata_props=t.metadata_props)
        moved.source = t.source
        return moved
    if attr.name in _SCALARS:
        dtype, rank = _SCALARS[attr.name]
        v = attr.value
        if dtype == DataType.STRING:
            vals = [v] if rank == 0 else list(v)
            return Tensor(name, dtype, [] if rank == 0 else [len(vals)], string_data=vals)
        arr = np.asarray(v, dtype=dtype.numpy_dtype)
        return Tensor.from_numpy(name, arr, dtype)
    return None


def movable_constants(model: Model) -> list[Node]:
    """The Constant nodes this pass would move (what no-constant-nodes rules out): in the
    model's graphs (not function bodies), not a graph output, at IR version 4 or later."""
    if model.ir_version < 4:
        return []
    return [n for g in model.graph.graphs() for n in g.nodes
            if n.op_type == "Constant" and n.is_onnx() and len(n.attributes) == 1
            and all(n.outputs[0] is not v for v in g.outputs) and _tensor(n, n.outputs[0].name) is not None]
