"""IR -> ONNX: the back-end lowering used for onnxruntime and Triton's onnxruntime backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
from onnx import TensorProto

from .ir.graph import Attribute, AttrType, Function, Graph, Model, Value
from .ir.tensor import SparseTensor, Tensor
from .ir.types import MapType, NoType, OptionalType, SequenceType, TensorType, Type

# Models whose weights exceed protobuf's 2 GiB limit keep them in an external-data file.
PROTO_LIMIT = 2**31 - 1 - (64 << 20)

# Decides where a tensor's bytes go: returns None to embed them as raw_data, or the
# (location, offset, length) of external data the caller has written them to.
TensorSink = Callable[[Tensor], "tuple[str, int, int] | None"]


# The model's metadata key that says its original declared the shapes of its inner values
# (value_info): the frontend sets it, the lowering (and the runtime's own) reads it, neither writes it.
DECLARED_SHAPES = "mcp.declared_shapes"


def declares_shapes(model: Model) -> bool:
    return model.metadata_props.get(DECLARED_SHAPES) == "1"


def to_onnx(model: Model, *, sink: TensorSink | None = None, value_info: bool | None = None) -> onnx.ModelProto:
    """Lower a Model to an ONNX ModelProto (raw_data copies unless `sink` places tensors).

    The main graph's inner shapes (value_info) go out as the original had them (`value_info`
    None: declares_shapes): onnxruntime fuses by them, so that the lowered model runs as the
    original runs. Told shapes the original did not declare, it fused Add + LayerNormalization
    into SkipLayerNormalization, measured 10% slower on CPU here (benchmarks/RESULTS.md, encoder);
    not told those the original declared, it lost that fusion and a dynamic-int8 model's roundings
    flipped (max abs 4.8 off the original). The shape contracts stay in the IR either way.
    """
    if value_info is None:
        value_info = declares_shapes(model)
    lw = _Lowering(sink)
    p = onnx.ModelProto(
        ir_version=model.ir_version, producer_name=model.producer_name,
        producer_version=model.producer_version, domain=model.domain,
        model_version=model.model_version, doc_string=model.doc_string)
    for dom, ver in model.opset_imports.items():
        p.opset_import.add(domain=dom, version=ver)
    lw.graph(model.graph, into=p.graph, value_info=value_info)   # built in place: a CopyFrom copies it all
    _set_props(p.metadata_props, {k: v for k, v in model.metadata_props.items() if k != DECLARED_SHAPES})
    for f in model.functions:
        p.functions.append(lw.function(f))
    return p


def write_onnx(model: Model, path: Path, *, external: bool | None = None) -> list[str]:
    """Write `model` as an ONNX file at `path` (not atomically: the caller stages it); the
    names written. Weights go to `<name>.data` beside it (tensors of 1 KiB and more, 64-byte
    aligned, copied file to file) when `external`, or when None and they exceed protobuf's
    2 GiB limit. Inner shapes as the original declared them (to_onnx says why)."""
    from .mcpir.writer import TensorCopier

    if external is None:
        external = sum(t.nbytes for t in model.tensors()) >= PROTO_LIMIT
    if not external:
        path.write_bytes(to_onnx(model).SerializeToString())
        return [path.name]
    data_name = path.name + ".data"
    with open(path.with_name(data_name), "wb") as data, TensorCopier() as copier:
        def sink(t: Tensor) -> tuple[str, int, int] | None:
            if t.nbytes < 1024:
                return None
            offset = data.tell()
            pad = (-offset) % 64
            data.write(b"\0" * pad)
            copier.write(t, data)
            return (data_name, offset + pad, t.nbytes)

        proto = to_onnx(model, sink=sink)
    path.write_bytes(proto.SerializeToString())
    return [path.name, data_name]


class _Lowering:
    def __init__(self, sink: TensorSink | None) -> None:
        self.sink = sink

    def function(self, f: Function) -> onnx.FunctionProto:
        fp = onnx.FunctionProto(name=f.name, domain=f.domain, doc_string=f.doc_string)
        if f.overload:
            fp.overload = f.overload
        fp.input.extend(v.name for v in f.body.inputs)
        fp.output.extend(v.name for v in f.body.outputs)
        fp.attribute.extend(f.attributes)
        fp.attribute_proto.extend(self.attribute(a) for a in f.attribute_defaults)
        for n in f.body.nodes:
            fp.node.append(self.node(n))
        for dom, ver in f.opset_imports.items():
            fp.opset_import.add(domain=dom, version=ver)
        fp.value_info.extend(self.value_info(v) for v in f.body.value_info.values())
        _set_props(fp.metadata_props, f.metadata_props)
        return fp

    def graph(self, g: Graph, into: onnx.GraphProto | None = None, value_info: bool = True) -> onnx.GraphProto:
        gp = onnx.GraphProto() if into is None else into
        gp.name, gp.doc_string = g.name, g.doc_string
        gp.input.extend(self.value_info(v) for v in g.inputs)
        gp.output.extend(self.value_info(v) for v in g.outputs)
        gp.initializer.extend(self.tensor(v.const) for v in g.initializers.values())
        gp.sparse_initializer.extend(self.sparse(v.const) for v in g.sparse_initializers.values())
        gp.node.extend(self.node(n) for n in g.nodes)
        if value_info:
            gp.value_info.extend(self.value_info(v) for v in g.value_info.values())
        _set_props(gp.metadata_props, g.metadata_props)
        return gp

    def node(self, n) -> onnx.NodeProto:  # noqa: ANN001
        np_ = onnx.NodeProto(op_type=n.op_type, domain=n.domain, name=n.name, doc_string=n.doc_string)
        if n.overload:
            np_.overload = n.overload
        np_.input.extend("" if v is None else v.name for v in n.inputs)
        np_.output.extend(v.name for v in n.outputs)
        np_.attribute.extend(self.attribute(a) for a in n.attributes.values())
        _set_props(np_.metadata_props, n.metadata_props)
        return np_

    def value_info(self, v: Value) -> onnx.ValueInfoProto:
        vi = onnx.ValueInfoProto(name=v.name, doc_string=v.doc_string)
        if v.type is not None:
            vi.type.CopyFrom(type_proto(v.type))
        _set_props(vi.metadata_props, v.metadata_props)
        return vi

    def attribute(self, a: Attribute) -> onnx.AttributeProto:
        ap = onnx.AttributeProto(name=a.name, type=int(a.type), doc_string=a.doc_string)
        if a.ref_attr_name:
            ap.ref_attr_name = a.ref_attr_name
            return ap
        k, v = a.type, a.value
        if k == AttrType.FLOAT:
            ap.f = v
        elif k == AttrType.INT:
            ap.i = v
        elif k == AttrType.STRING:
            ap.s = v
        elif k == AttrType.TENSOR:
            ap.t.CopyFrom(self.tensor(v))
        elif k == AttrType.GRAPH:
            self.graph(v, into=ap.g)
        elif k == AttrType.FLOATS:
            ap.floats.extend(v)
        elif k == AttrType.INTS:
            ap.ints.extend(v)
        elif k == AttrType.STRINGS:
            ap.strings.extend(v)
        elif k == AttrType.TENSORS:
            ap.tensors.extend(self.tensor(t) for t in v)
        elif k == AttrType.GRAPHS:
            for g in v:
                self.graph(g, into=ap.graphs.add())
        elif k == AttrType.SPARSE_TENSOR:
            ap.sparse_tensor.CopyFrom(self.sparse(v))
        elif k == AttrType.SPARSE_TENSORS:
            ap.sparse_tensors.extend(self.sparse(s) for s in v)
        elif k == AttrType.TYPE_PROTO:
            ap.tp.CopyFrom(type_proto(v))
        elif k == AttrType.TYPE_PROTOS:
            ap.type_protos.extend(type_proto(t) for t in v)
        return ap

    def tensor(self, t: Tensor) -> onnx.TensorProto:
        tp = t.to_onnx_proto_header()
        _set_props(tp.metadata_props, t.metadata_props)
        if t.string_data is not None:
            tp.string_data.extend(t.string_data)
            return tp
        placed = self.sink(t) if self.sink is not None else None
        if placed is None:
            tp.raw_data = bytes(t.raw)
        else:
            location, offset, length = placed
            tp.data_location = TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
                tp.external_data.add(key=key, value=value)
        return tp

    def sparse(self, s: SparseTensor) -> onnx.SparseTensorProto:
        sp = onnx.SparseTensorProto(dims=s.dims)
        sp.values.CopyFrom(self.tensor(s.values))
        sp.indices.CopyFrom(self.tensor(s.indices))
        return sp


def type_proto(t: Type) -> onnx.TypeProto:
    tp = onnx.TypeProto(denotation=t.denotation)
    if isinstance(t, TensorType):
        tt = tp.sparse_tensor_type if t.sparse else tp.tensor_type
        tt.elem_type = int(t.elem_type)
        if t.shape is not None:
            tt.shape.SetInParent()
            for i, d in enumerate(t.shape):
                dim = tt.shape.dim.add()
                if isinstance(d, int):
                    dim.dim_value = d
                elif d is not None:
                    dim.dim_param = str(d)
                if t.dim_denotations is not None:
                    dim.denotation = t.dim_denotations[i]
    elif isinstance(t, SequenceType):
        tp.sequence_type.SetInParent()
        if t.elem is not None:
            tp.sequence_type.elem_type.CopyFrom(type_proto(t.elem))
    elif isinstance(t, OptionalType):
        tp.optional_type.SetInParent()
        if t.elem is not None:
            tp.optional_type.elem_type.CopyFrom(type_proto(t.elem))
    elif isinstance(t, MapType):
        tp.map_type.key_type = int(t.key_type)
        if t.value is not None:
            tp.map_type.value_type.CopyFrom(type_proto(t.value))
    else:
        assert isinstance(t, NoType)
    return tp


def _set_props(field, props: dict[str, str]) -> None:  # noqa: ANN001
    for k, v in props.items():
        field.add(key=k, value=v)
