"""IR -> .mcpir: the FlatBuffer of descriptors, then the aligned data section of weights."""

from __future__ import annotations

import math
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import flatbuffers
import numpy as np

from ..files import follow_umask, temp_prefix
from ..ir.dims import Dim, ShapeExpr
from ..ir.graph import Attribute, AttrType, Function, Graph, Model, Node, Value
from ..ir.tensor import SparseTensor, Tensor
from ..ir.types import MapType, NoType, OptionalType, SequenceType, TensorType, Type
from ..ir_schema import FILE_IDENTIFIER, SCHEMA_VERSION
from ..ir_schema import mcp_ir_generated as fb

_EXPR_OPS = {"add": fb.ExprOp.ADD, "sub": fb.ExprOp.SUB, "mul": fb.ExprOp.MUL,
             "floor_div": fb.ExprOp.FLOOR_DIV, "ceil_div": fb.ExprOp.CEIL_DIV,
             "mod": fb.ExprOp.MOD, "max": fb.ExprOp.MAX, "min": fb.ExprOp.MIN}

# Weights are copied into the file in chunks of this size, never as one big bytes object.
_COPY_CHUNK = 16 << 20
# File-backed tensors at least this large are copied file to file in the kernel.
_KERNEL_COPY_MIN = 1 << 20


@dataclass(frozen=True)
class WriteStats:
    path: Path
    file_bytes: int
    header_bytes: int
    data_bytes: int
    tensors: int


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def write_mcpir(model: Model, path: str | os.PathLike, *, alignment: int = 64) -> WriteStats:
    """Write `model` to `path` atomically (temp file in the same folder, then os.replace)."""
    if alignment < 64 or alignment & (alignment - 1):
        raise ValueError("alignment must be a power of two >= 64")
    path = Path(path)
    enc = _Encoder(alignment)
    header = enc.model(model)
    data_start = align_up(len(header), alignment)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent or ".")
    try:
        follow_umask(fd)  # mkstemp makes 0600: a server running as another user must read it
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(b"\0" * (data_start - len(header)))
            pos = 0
            with TensorCopier() as copier:
                for offset, t in enc.placed:
                    if offset > pos:
                        f.write(b"\0" * (offset - pos))
                    copier.write(t, f)
                    pos = offset + t.nbytes
            if enc.data_length > pos:
                f.write(b"\0" * (enc.data_length - pos))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return WriteStats(path, data_start + enc.data_length, len(header), enc.data_length, len(enc.placed))


class TensorCopier:
    """Writes tensors' bytes to a file; file-backed ones with os.copy_file_range, in the kernel, not
    through our memory (the weights are never paged into the process)."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}
        self.enabled = hasattr(os, "copy_file_range")

    def __enter__(self) -> TensorCopier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, t: Tensor, out) -> None:  # noqa: ANN001 - a binary file object
        if not self.copy(t, out):
            raw = memoryview(t.raw).cast("B")
            for i in range(0, len(raw), _COPY_CHUNK):
                out.write(raw[i:i + _COPY_CHUNK])

    def copy(self, t: Tensor, out) -> bool:  # noqa: ANN001 - a binary file object
        if not self.enabled or t.source is None or t.nbytes < _KERNEL_COPY_MIN:
            return False
        path, offset = t.source
        n = t.nbytes
        out.flush()
        start = out.tell()
        try:
            fd = self.fds.get(path)
            if fd is None:
                fd = self.fds[path] = os.open(path, os.O_RDONLY)
            done = 0
            while done < n:
                k = os.copy_file_range(fd, out.fileno(), n - done, offset + done)
                if k <= 0:
                    raise OSError(f"copy_file_range stopped at {done} of {n} bytes")
                done += k
        except OSError:
            # Unsupported between these file systems, or the source changed: copy through memory.
            self.enabled = False
            out.seek(start)
            out.truncate()
            return False
        out.seek(start + n)
        return True

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def to_bytes(model: Model, *, alignment: int = 64) -> bytes:
    """The whole .mcpir file in memory (for tests and small models)."""
    enc = _Encoder(alignment)
    header = enc.model(model)
    out = bytearray(header)
    out += b"\0" * (align_up(len(header), alignment) - len(header))
    base = len(out)
    out += b"\0" * enc.data_length
    for offset, t in enc.placed:
        out[base + offset: base + offset + t.nbytes] = t.raw
    return bytes(out)


class _Encoder:
    """Builds the FlatBuffer bottom-up; assigns each tensor its place in the data section."""

    def __init__(self, alignment: int) -> None:
        self.b = flatbuffers.Builder(1024)
        self.alignment = alignment
        self.placed: list[tuple[int, Tensor]] = []
        self.data_length = 0
        self.symbols: dict[str, int] = {}
        # equal types and dims are written once and shared (a table may be referenced many times):
        # most values of a network repeat a handful of shapes
        self.types: dict[Type, int] = {}
        self.dims: dict[tuple, int] = {}
        self._strings: dict[str, int] = {}
        self._empty: int | None = None
        # so are equal plain attributes (strides=[1, 1], group=1, ...) and equal attribute lists
        self._attributes: dict[tuple, int] = {}
        self._attribute_lists: dict[tuple[int, ...], int] = {}

    # -- helpers ------------------------------------------------------------------------------
    # Strings and the empty vector are written once and referenced wherever they recur (a
    # FlatBuffer may point at one object from many places): every value name is written once
    # though it appears as a producer's output and each consumer's input, and an op type once
    # per model. At 50k nodes this halves what the builder writes.
    def s(self, text: str | None) -> int:
        return self.shared(text) if text else 0

    def shared(self, text: str) -> int:
        off = self._strings.get(text)
        if off is None:
            off = self._strings[text] = self.b.CreateString(text)
        return off

    def vec(self, offsets: list[int]) -> int:
        if not offsets:
            if self._empty is None:
                self.b.StartVector(4, 0, 4)
                self._empty = self.b.EndVector()
            return self._empty
        # What StartVector + PrependUOffsetTRelative per element (last first) + EndVector write,
        # in one pack (the builder's per-element calls were a third of the writer's time):
        # element i, written at head + 4 i, holds the distance from its own position to the
        # object at offset o (offsets count from the buffer's end); the count below them.
        b, n = self.b, len(offsets)
        if (len(b.Bytes) - b.head) & 3 or b.head < 4 * n + 4 or b.minalign < 4:
            b.Prep(4, 4 * n)   # align, make room (what StartVector does; seldom needed)
        end = len(b.Bytes)
        head = b.head - 4 * n
        struct.pack_into(f"<{n + 1}I", b.Bytes, head - 4, n, *[end - head - 4 * i - o for i, o in enumerate(offsets)])
        b.head = head - 4
        return end - b.head

    def table(self, numfields: int, fields: list[tuple[int, int]]) -> int:
        """A table of offset fields only, as the builder's StartObject(numfields), its
        PrependUOffsetTRelativeSlot per (slot, offset) and EndObject write it (the same bytes,
        its vtables shared with the builder's), in a few packs: a node's and a value's calls
        into the builder were most of the writer's time. A 0 offset (an absent field) is left
        out."""
        b = self.b
        object_end = len(b.Bytes) - b.head
        fields = [f for f in fields if f[1]]
        at: dict[int, int] = {}   # slot -> the field's offset from the buffer's end
        n = len(fields)
        if (len(b.Bytes) - b.head) & 3 or b.head < 4 * n + 4 or b.minalign < 4:
            b.Prep(4, 4 * n)   # align, make room for the fields and the vtable offset (seldom needed)
        end, head, words = len(b.Bytes), b.head, []
        for slot, off in fields:   # (what PrependUOffsetTRelativeSlot writes for each)
            head -= 4
            at[slot] = end - head
            words.append(end - head - off)
        words.reverse()
        head -= 4   # the object's offset to its vtable, written below when known
        struct.pack_into(f"<{n + 1}I", b.Bytes, head, 0, *words)
        b.head = head
        obj = len(b.Bytes) - b.head
        used = max(at, default=-1) + 1   # the vtable leaves out absent slots past the last present one
        entries = [obj - at[slot] if slot in at else 0 for slot in range(used)]
        key = (*reversed(entries), obj - object_end)   # the builder's key for this vtable
        vt = b.vtables.get(key)
        if vt is None:
            b.Prep(2, 2 * (used + 2))
            head = b.head - 2 * (used + 2)
            struct.pack_into(f"<{used + 2}H", b.Bytes, head, 2 * (used + 2), obj - object_end, *entries)
            b.head = head
            vt = b.vtables[key] = len(b.Bytes) - head
            struct.pack_into("<i", b.Bytes, len(b.Bytes) - obj, vt - obj)
        else:
            struct.pack_into("<i", b.Bytes, b.head, vt - obj)
        return obj

    def strings(self, items) -> int:  # noqa: ANN001
        return self.vec([self.shared(x) for x in items])

    def i64s(self, xs) -> int:  # noqa: ANN001
        return self.b.CreateNumpyVector(np.asarray(list(xs), dtype="<i8"))

    def props(self, d: dict[str, str]) -> int:
        if not d:
            return 0
        items = []
        for k, v in d.items():
            ko, vo = self.b.CreateString(k), self.s(v)
            fb.KeyValueStart(self.b)
            fb.KeyValueAddKey(self.b, ko)
            if vo:
                fb.KeyValueAddValue(self.b, vo)
            items.append(fb.KeyValueEnd(self.b))
        return self.vec(items)

    def bytes_vec(self, items: list[bytes]) -> int:
        objs = []
        for x in items:
            d = self.b.CreateByteVector(bytes(x))
            fb.BytesStart(self.b)
            fb.BytesAddData(self.b, d)
            objs.append(fb.BytesEnd(self.b))
        return self.vec(objs)

    # -- model --------------------------------------------------------------------------------
    def model(self, m: Model) -> bytes:
        b = self.b
        graph = self.graph(m.graph)
        funcs = self.vec([self.function(f) for f in m.functions])
        opsets = self.opsets(m.opset_imports)
        props = self.props(m.metadata_props)
        syms = []
        for name in self.symbols:
            no = b.CreateString(name)
            fb.SymbolStart(b)
            fb.SymbolAddName(b, no)
            syms.append(fb.SymbolEnd(b))
        syms_vec = self.vec(syms)
        strs = [self.s(x) for x in (m.producer_name, m.producer_version, m.domain, m.doc_string)]
        fb.ModelStart(b)
        fb.ModelAddSchemaVersion(b, fb.CreateSchemaVersion(b, *SCHEMA_VERSION))
        fb.ModelAddIrVersion(b, m.ir_version)
        for add, o in zip((fb.ModelAddProducerName, fb.ModelAddProducerVersion, fb.ModelAddDomain,
                           fb.ModelAddDocString), strs):
            if o:
                add(b, o)
        fb.ModelAddModelVersion(b, m.model_version)
        fb.ModelAddOpsetImports(b, opsets)
        fb.ModelAddGraph(b, graph)
        fb.ModelAddFunctions(b, funcs)
        if props:
            fb.ModelAddMetadataProps(b, props)
        fb.ModelAddSymbols(b, syms_vec)
        fb.ModelAddDataAlignment(b, self.alignment)
        fb.ModelAddDataLength(b, self.data_length)
        b.FinishSizePrefixed(fb.ModelEnd(b), FILE_IDENTIFIER)
        return bytes(b.Output())

    def opsets(self, opsets: dict[str, int]) -> int:
        items = []
        for dom, ver in opsets.items():
            do = self.s(dom)
            fb.OperatorSetIdStart(self.b)
            if do:
                fb.OperatorSetIdAddDomain(self.b, do)
            fb.OperatorSetIdAddVersion(self.b, ver)
            items.append(fb.OperatorSetIdEnd(self.b))
        return self.vec(items)

    def function(self, f: Function) -> int:
        b = self.b
        name, dom, ovl, doc = (self.s(x) for x in (f.name, f.domain, f.overload, f.doc_string))
        ins = self.strings(v.name for v in f.body.inputs)
        outs = self.strings(v.name for v in f.body.outputs)
        attrs = self.strings(f.attributes)
        defaults = self.vec([self.attribute(a) for a in f.attribute_defaults])
        nodes = self.vec([self.node(n) for n in f.body.nodes])
        opsets = self.opsets(f.opset_imports)
        vinfo = self.vec([self.value(v) for v in f.body.value_info.values()])
        props = self.props(f.metadata_props)
        fb.FunctionStart(b)
        fb.FunctionAddName(b, name)
        for add, o in ((fb.FunctionAddDomain, dom), (fb.FunctionAddOverload, ovl),
                       (fb.FunctionAddDocString, doc), (fb.FunctionAddMetadataProps, props)):
            if o:
                add(b, o)
        fb.FunctionAddInputs(b, ins)
        fb.FunctionAddOutputs(b, outs)
        fb.FunctionAddAttributes(b, attrs)
        fb.FunctionAddAttributeProtos(b, defaults)
        fb.FunctionAddNodes(b, nodes)
        fb.FunctionAddOpsetImports(b, opsets)
        fb.FunctionAddValueInfo(b, vinfo)
        return fb.FunctionEnd(b)

    # -- graphs -------------------------------------------------------------------------------
    def graph(self, g: Graph) -> int:
        b = self.b
        name, doc = self.s(g.name), self.s(g.doc_string)
        inputs = self.vec([self.value(v) for v in g.inputs])
        inits = self.vec([self.tensor(v.const) for v in g.initializers.values()])
        sparse = self.vec([self.sparse(v.const) for v in g.sparse_initializers.values()])
        nodes = self.vec([self.node(n) for n in g.nodes])
        outputs = self.vec([self.value(v) for v in g.outputs])
        vinfo = self.vec([self.value(v) for v in g.value_info.values()])
        props = self.props(g.metadata_props)
        fb.GraphStart(b)
        if name:
            fb.GraphAddName(b, name)
        fb.GraphAddNodes(b, nodes)
        fb.GraphAddInputs(b, inputs)
        fb.GraphAddOutputs(b, outputs)
        fb.GraphAddInitializers(b, inits)
        fb.GraphAddSparseInitializers(b, sparse)
        fb.GraphAddValueInfo(b, vinfo)
        if doc:
            fb.GraphAddDocString(b, doc)
        if props:
            fb.GraphAddMetadataProps(b, props)
        return fb.GraphEnd(b)

    def node(self, n: Node) -> int:
        attrs = self.attribute_list([self.attribute(a) for a in n.attributes.values()])
        s, shared = self.s, self.shared
        name, op, dom, ovl, doc = s(n.name), shared(n.op_type), s(n.domain), s(n.overload), s(n.doc_string)
        ins = self.vec([shared("" if v is None else v.name) for v in n._inputs])
        outs = self.vec([shared(v.name) for v in n.outputs])
        props = self.props(n.metadata_props)
        # op_type, name, domain, overload, doc_string, metadata_props, inputs, outputs, attributes
        return self.table(9, [(1, op), (0, name), (2, dom), (3, ovl), (7, doc), (8, props), (4, ins), (5, outs),
                              (6, attrs)])

    def value(self, v: Value) -> int:
        name = self.shared(v.name)
        typ = self.type(v.type) if v.type is not None else 0
        doc = self.s(v.doc_string)
        props = self.props(v.metadata_props)
        if not v.layout:   # (the layout byte is left out at its default, 0)
            return self.table(5, [(0, name), (1, typ), (3, doc), (4, props)])
        b = self.b   # (a layout contract: interface values of a layout-converted model)
        fb.ValueStart(b)
        fb.ValueAddName(b, name)
        if typ:
            fb.ValueAddType(b, typ)
        fb.ValueAddLayout(b, int(v.layout))
        if doc:
            fb.ValueAddDocString(b, doc)
        if props:
            fb.ValueAddMetadataProps(b, props)
        return fb.ValueEnd(b)

    # -- types and dims -----------------------------------------------------------------------
    def type(self, t: Type) -> int:
        try:
            cached = self.types.get(t)
        except TypeError:   # a type holding something unhashable: written each time
            return self._type(t)
        if cached is None:
            cached = self.types[t] = self._type(t)
        return cached

    def _type(self, t: Type) -> int:
        b = self.b
        den = self.s(t.denotation)
        dims = value_type = 0
        if isinstance(t, TensorType) and t.shape is not None:
            denots = t.dim_denotations or ("",) * len(t.shape)
            dims = self.vec([self.dim(d, dn) for d, dn in zip(t.shape, denots)])
        elif isinstance(t, (SequenceType, OptionalType)) and t.elem is not None:
            value_type = self.type(t.elem)
        elif isinstance(t, MapType) and t.value is not None:
            value_type = self.type(t.value)
        fb.TypeStart(b)
        if isinstance(t, TensorType):
            fb.TypeAddKind(b, fb.TypeKind.SPARSE_TENSOR if t.sparse else fb.TypeKind.TENSOR)
            fb.TypeAddElemType(b, int(t.elem_type))
            fb.TypeAddHasShape(b, t.shape is not None)
            if dims:
                fb.TypeAddDims(b, dims)
        elif isinstance(t, SequenceType):
            fb.TypeAddKind(b, fb.TypeKind.SEQUENCE)
        elif isinstance(t, OptionalType):
            fb.TypeAddKind(b, fb.TypeKind.OPTIONAL)
        elif isinstance(t, MapType):
            fb.TypeAddKind(b, fb.TypeKind.MAP)
            fb.TypeAddKeyType(b, int(t.key_type))
        else:
            assert isinstance(t, NoType)
            fb.TypeAddKind(b, fb.TypeKind.NONE)
        if value_type:
            fb.TypeAddValueType(b, value_type)
        if den:
            fb.TypeAddDenotation(b, den)
        return fb.TypeEnd(b)

    def symbol(self, name: str) -> int:
        return self.symbols.setdefault(name, len(self.symbols))

    def dim(self, d: Dim, denotation: str) -> int:
        key = (type(d), d, denotation)   # 1 and True, 1 and 1.0 stay apart
        cached = self.dims.get(key)
        if cached is None:
            cached = self.dims[key] = self._dim(d, denotation)
        return cached

    def _dim(self, d: Dim, denotation: str) -> int:
        b = self.b
        expr = self.expr(d) if isinstance(d, ShapeExpr) else 0
        den = self.s(denotation)
        fb.DimStart(b)
        if d is None:
            fb.DimAddKind(b, fb.DimKind.UNKNOWN)
        elif isinstance(d, int):
            fb.DimAddKind(b, fb.DimKind.CONSTANT)
            fb.DimAddValue(b, d)
        elif isinstance(d, str):
            fb.DimAddKind(b, fb.DimKind.SYMBOL)
            fb.DimAddSymbol(b, self.symbol(d))
        else:
            fb.DimAddKind(b, fb.DimKind.EXPR)
            fb.DimAddExpr(b, expr)
        if den:
            fb.DimAddDenotation(b, den)
        return fb.DimEnd(b)

    def expr(self, d: Dim) -> int:
        b = self.b
        if isinstance(d, ShapeExpr):
            lhs, rhs = self.expr(d.lhs), self.expr(d.rhs)
            fb.ShapeExprStart(b)
            fb.ShapeExprAddOp(b, _EXPR_OPS[d.op])
            fb.ShapeExprAddLhs(b, lhs)
            fb.ShapeExprAddRhs(b, rhs)
            return fb.ShapeExprEnd(b)
        fb.ShapeExprStart(b)
        if isinstance(d, str):
            fb.ShapeExprAddOp(b, fb.ExprOp.SYMBOL)
            fb.ShapeExprAddSymbol(b, self.symbol(d))
        else:
            fb.ShapeExprAddOp(b, fb.ExprOp.CONST)
            fb.ShapeExprAddValue(b, int(d))
        return fb.ShapeExprEnd(b)

    # -- tensors and attributes ---------------------------------------------------------------
    def tensor(self, t: Tensor) -> int:
        b = self.b
        name, doc = self.s(t.name), self.s(t.doc_string)
        dims = self.i64s(t.dims)
        strings = self.bytes_vec(t.string_data) if t.string_data is not None else 0
        props = self.props(t.metadata_props)
        offset = length = 0
        if t.string_data is None:
            length = t.nbytes
            offset = align_up(self.data_length, self.alignment)
            self.placed.append((offset, t))
            self.data_length = offset + length
        fb.TensorStart(b)
        if name:
            fb.TensorAddName(b, name)
        fb.TensorAddDtype(b, int(t.dtype))
        fb.TensorAddDims(b, dims)
        fb.TensorAddOffset(b, offset)
        fb.TensorAddLength(b, length)
        if strings:
            fb.TensorAddStringData(b, strings)
        if doc:
            fb.TensorAddDocString(b, doc)
        if props:
            fb.TensorAddMetadataProps(b, props)
        return fb.TensorEnd(b)

    def sparse(self, s: SparseTensor) -> int:
        values, indices = self.tensor(s.values), self.tensor(s.indices)
        dims = self.i64s(s.dims)
        fb.SparseTensorStart(self.b)
        fb.SparseTensorAddValues(self.b, values)
        fb.SparseTensorAddIndices(self.b, indices)
        fb.SparseTensorAddDims(self.b, dims)
        return fb.SparseTensorEnd(self.b)

    def attribute_list(self, offsets: list[int]) -> int:
        key = tuple(offsets)
        cached = self._attribute_lists.get(key)
        if cached is None:
            cached = self._attribute_lists[key] = self.vec(offsets)
        return cached

    def attribute(self, a: Attribute) -> int:
        key = _plain_key(a)
        if key is None:
            return self._attribute(a)
        cached = self._attributes.get(key)
        if cached is None:
            cached = self._attributes[key] = self._attribute(a)
        return cached

    def _attribute(self, a: Attribute) -> int:
        b = self.b
        k, v = a.type, a.value
        name, ref, doc = self.shared(a.name), self.s(a.ref_attr_name), self.s(a.doc_string)
        payload: list[tuple] = []
        if not a.ref_attr_name:
            if k == AttrType.FLOAT:
                payload.append((_add_f, v))
            elif k == AttrType.INT:
                payload.append((fb.AttributeAddI, v))
            elif k == AttrType.STRING:
                payload.append((fb.AttributeAddS, b.CreateByteVector(bytes(v))))
            elif k == AttrType.TENSOR:
                payload.append((fb.AttributeAddT, self.tensor(v)))
            elif k == AttrType.GRAPH:
                payload.append((fb.AttributeAddG, self.graph(v)))
            elif k == AttrType.FLOATS:
                payload.append((fb.AttributeAddFloats, b.CreateNumpyVector(np.asarray(v, dtype="<f4"))))
            elif k == AttrType.INTS:
                payload.append((fb.AttributeAddInts, self.i64s(v)))
            elif k == AttrType.STRINGS:
                payload.append((fb.AttributeAddStrings, self.bytes_vec(v)))
            elif k == AttrType.TENSORS:
                payload.append((fb.AttributeAddTensors, self.vec([self.tensor(t) for t in v])))
            elif k == AttrType.GRAPHS:
                payload.append((fb.AttributeAddGraphs, self.vec([self.graph(g) for g in v])))
            elif k == AttrType.SPARSE_TENSOR:
                payload.append((fb.AttributeAddSparseTensor, self.sparse(v)))
            elif k == AttrType.SPARSE_TENSORS:
                payload.append((fb.AttributeAddSparseTensors, self.vec([self.sparse(s) for s in v])))
            elif k == AttrType.TYPE_PROTO:
                payload.append((fb.AttributeAddTp, self.type(v)))
            elif k == AttrType.TYPE_PROTOS:
                payload.append((fb.AttributeAddTypeProtos, self.vec([self.type(t) for t in v])))
        fb.AttributeStart(b)
        fb.AttributeAddName(b, name)
        fb.AttributeAddType(b, int(k))
        if ref:
            fb.AttributeAddRefAttrName(b, ref)
        if doc:
            fb.AttributeAddDocString(b, doc)
        for add, x in payload:
            add(b, x)
        return fb.AttributeEnd(b)


def _add_f(b: flatbuffers.Builder, v: float) -> None:
    """Attribute.f; -0.0 compares equal to the field's default 0.0, and the builder would leave it
    out (the reader then gives back 0.0): written always."""
    if v == 0 and math.copysign(1.0, v) < 0:
        b.ForceDefaults(True)
        fb.AttributeAddF(b, v)
        b.ForceDefaults(False)
    else:
        fb.AttributeAddF(b, v)


def _plain_key(a: Attribute) -> tuple | None:
    """What an attribute holding a number, text or list of numbers writes (so that equal ones are
    written once); None for one holding a tensor, graph or type, written where it is."""
    k, v = a.type, a.value
    if a.ref_attr_name:
        value: object = None
    elif k == AttrType.INT:
        value = int(v)
    elif k == AttrType.FLOAT:
        value = struct.pack("<f", v)   # the float32 written: -0.0 is not 0.0, a NaN is itself
    elif k == AttrType.STRING:
        value = bytes(v)
    elif k == AttrType.INTS:
        value = np.asarray(list(v), dtype="<i8").tobytes()
    elif k == AttrType.FLOATS:
        value = np.asarray(v, dtype="<f4").tobytes()
    else:
        return None
    return (a.name, int(k), a.ref_attr_name, a.doc_string, value)
