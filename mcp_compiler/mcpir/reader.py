"""`.mcpir` -> IR. The file is untrusted: it is verified before any accessor follows an offset."""

from __future__ import annotations

import mmap
import os
import stat
import struct
from functools import lru_cache
from pathlib import Path

from ..errors import InvalidModelError, SchemaVersionError
from ..ir.build import GraphBuilder
from ..ir.dims import Dim, ShapeExpr
from ..ir.graph import Attribute, AttrType, Function, Graph, Layout, Model, Value
from ..ir.tensor import SparseTensor, Tensor
from ..ir.types import DataType, MapType, NoType, OptionalType, SequenceType, TensorType, Type
from ..ir_schema import FILE_IDENTIFIER, SCHEMA_VERSION, schema_text
from ..ir_schema import mcp_ir_generated as fb
from .verify import VerifyError, parse_layout, verify_buffer
from .writer import align_up

_EXPR_OPS = {fb.ExprOp.ADD: "add", fb.ExprOp.SUB: "sub", fb.ExprOp.MUL: "mul",
             fb.ExprOp.FLOOR_DIV: "floor_div", fb.ExprOp.CEIL_DIV: "ceil_div",
             fb.ExprOp.MOD: "mod", fb.ExprOp.MAX: "max", fb.ExprOp.MIN: "min"}
MAX_SUBGRAPH_DEPTH = 64
MAX_ALIGNMENT = 1 << 20


@lru_cache(maxsize=1)
def schema_layout() -> dict:
    """The verifier's field layout, parsed from the installed mcp_ir.fbs."""
    return parse_layout(schema_text())


def is_mcpir(head: bytes) -> bool:
    """True when the first bytes of a file carry the MCP-IR identifier."""
    return len(head) >= 12 and head[8:12] == FILE_IDENTIFIER


def read_mcpir(path: str | os.PathLike) -> Model:
    """Map `path` and build the IR; weights stay views of the mapping (no copy)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise InvalidModelError(path, "not a regular file")
            if st.st_size < 12:
                raise InvalidModelError(path, f"not an MCP-IR file (only {st.st_size} bytes)")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise InvalidModelError(path, f"cannot read: {e.strerror}") from None
    return from_buffer(memoryview(mm), path=path, file_backed=True)


def from_buffer(buf: bytes | memoryview, *, path: object = None, file_backed: bool = False) -> Model:
    """Build the IR from a whole `.mcpir` file's bytes (a memoryview of an mmap keeps it lazy)."""
    buf = memoryview(buf).cast("B") if not isinstance(buf, bytes) else memoryview(buf)
    size = len(buf)
    if size < 12 or bytes(buf[8:12]) != FILE_IDENTIFIER:
        found = bytes(buf[8:12]) if size >= 12 else b""
        raise InvalidModelError(path, f"not an MCP-IR file (identifier {found!r}, expected {FILE_IDENTIFIER!r})")
    (fb_len,) = struct.unpack_from("<I", buf, 0)
    if 4 + fb_len > size:
        raise InvalidModelError(path, f"corrupt MCP-IR: header claims {fb_len} bytes, file has {size}")
    header = bytes(buf[4:4 + fb_len])
    try:
        verify_buffer(header, schema_layout())
    except VerifyError as e:
        raise InvalidModelError(path, f"corrupt MCP-IR: {e}") from None
    root = fb.Model.GetRootAs(header, 0)
    sv = root.SchemaVersion()
    if sv.Major() != SCHEMA_VERSION[0]:
        raise SchemaVersionError(
            path, f"MCP-IR schema version {sv.Major()}.{sv.Minor()}.{sv.Patch()} is not readable by "
                  f"this mcp-cli (reads {SCHEMA_VERSION[0]}.x); convert the model again")
    align = root.DataAlignment()
    if align < 1 or align > MAX_ALIGNMENT or align & (align - 1):
        raise InvalidModelError(path, f"corrupt MCP-IR: data alignment {align} is not a power of two")
    start = align_up(4 + fb_len, align)
    length = root.DataLength()
    if start + length > size:
        raise InvalidModelError(
            path, f"corrupt MCP-IR: data section [{start}, {start + length}) runs past the end of "
                  f"the file ({size} bytes; truncated?)")
    dec = _Decoder(buf[start:start + length], align, path)
    if file_backed:
        dec.source = (str(path), start)
    try:
        model = dec.model(root)
    except InvalidModelError as e:
        if e.path is None and path is not None:
            raise InvalidModelError(path, e.reason) from None
        raise
    except (ValueError, UnicodeDecodeError, struct.error, IndexError, TypeError) as e:
        raise InvalidModelError(path, f"corrupt MCP-IR: {type(e).__name__}: {e}") from None
    dec.check_overlaps()
    return model


class _Decoder:
    def __init__(self, data: memoryview, alignment: int, path: object) -> None:
        self.data = data
        self.alignment = alignment
        self.path = path
        self.symbols: list[str] = []
        self.extents: list[tuple[int, int, str]] = []
        self.source: tuple[str, int] | None = None   # (file, data section start) when mapped

    def bad(self, msg: str) -> InvalidModelError:
        return InvalidModelError(self.path, f"corrupt MCP-IR: {msg}")

    @staticmethod
    def s(x: bytes | None) -> str:
        return x.decode("utf-8") if x else ""

    def props(self, obj) -> dict[str, str]:  # noqa: ANN001
        return {self.s(kv.Key()): self.s(kv.Value())
                for kv in (obj.MetadataProps(j) for j in range(obj.MetadataPropsLength()))}

    # -- model --------------------------------------------------------------------------------
    def model(self, r: fb.Model) -> Model:
        self.symbols = [self.s(r.Symbols(j).Name()) for j in range(r.SymbolsLength())]
        m = Model(
            graph=self.graph(r.Graph(), GraphBuilder(self.s(r.Graph().Name()))),
            opset_imports=self.opsets(r), ir_version=r.IrVersion(),
            producer_name=self.s(r.ProducerName()), producer_version=self.s(r.ProducerVersion()),
            domain=self.s(r.Domain()), model_version=r.ModelVersion(),
            doc_string=self.s(r.DocString()), metadata_props=self.props(r))
        m.functions = [self.function(r.Functions(j)) for j in range(r.FunctionsLength())]
        return m

    def opsets(self, r) -> dict[str, int]:  # noqa: ANN001
        out = {}
        for j in range(r.OpsetImportsLength()):
            o = r.OpsetImports(j)
            out[self.s(o.Domain())] = o.Version()
        return out

    def function(self, f: fb.Function) -> Function:
        name, dom = self.s(f.Name()), self.s(f.Domain())
        b = GraphBuilder(name, where=f"function {dom}.{name}")
        for j in range(f.InputsLength()):
            b.add_input(Value(self.s(f.Inputs(j))))
        for j in range(f.NodesLength()):
            self.node(b, f.Nodes(j))
        for j in range(f.OutputsLength()):
            b.add_output(self.s(f.Outputs(j)))
        for j in range(f.ValueInfoLength()):
            self.annotate(b.add_value_info(self.s(f.ValueInfo(j).Name())), f.ValueInfo(j))
        return Function(
            name=name, domain=dom, body=b.graph,
            attributes=[self.s(f.Attributes(j)) for j in range(f.AttributesLength())],
            attribute_defaults=[self.attribute(b, f.AttributeProtos(j), name)
                                for j in range(f.AttributeProtosLength())],
            opset_imports=self.opsets(f), overload=self.s(f.Overload()),
            doc_string=self.s(f.DocString()), metadata_props=self.props(f))

    # -- graphs -------------------------------------------------------------------------------
    def graph(self, g: fb.Graph, b: GraphBuilder) -> Graph:
        if b.depth > MAX_SUBGRAPH_DEPTH:
            raise self.bad(f"subgraphs nested deeper than {MAX_SUBGRAPH_DEPTH}")
        for j in range(g.InputsLength()):
            fv = g.Inputs(j)
            v = Value(self.s(fv.Name()))
            self.annotate(v, fv)
            b.add_input(v)
        for j in range(g.InitializersLength()):
            t = self.tensor(g.Initializers(j))
            b.add_initializer(Value(t.name, const=t))
        for j in range(g.SparseInitializersLength()):
            st = self.sparse(g.SparseInitializers(j))
            b.add_initializer(Value(st.name, const=st), sparse=True)
        for j in range(g.NodesLength()):
            self.node(b, g.Nodes(j))
        for j in range(g.OutputsLength()):
            fv = g.Outputs(j)
            v = b.add_output(self.s(fv.Name()))
            self.annotate(v, fv, force=True)
        for j in range(g.ValueInfoLength()):
            fv = g.ValueInfo(j)
            self.annotate(b.add_value_info(self.s(fv.Name())), fv)
        b.graph.doc_string = self.s(g.DocString())
        b.graph.metadata_props = self.props(g)
        return b.graph

    def node(self, b: GraphBuilder, n: fb.Node) -> None:
        name, op = self.s(n.Name()), self.s(n.OpType())
        attrs = [self.attribute(b, n.Attributes(j), name or op) for j in range(n.AttributesLength())]
        b.add_node(op, self.s(n.Domain()), name,
                   [self.s(n.Inputs(j)) for j in range(n.InputsLength())],
                   [self.s(n.Outputs(j)) for j in range(n.OutputsLength())], attrs,
                   overload=self.s(n.Overload()), doc_string=self.s(n.DocString()),
                   metadata_props=self.props(n))

    def annotate(self, v: Value, fv: fb.Value, force: bool = False) -> None:
        t = fv.Type()
        if t is not None and (force or v.type is None):
            v.type = self.type(t, 0)
        v.layout = Layout(fv.Layout())
        if force or not v.doc_string:
            v.doc_string = self.s(fv.DocString())
        if fv.MetadataPropsLength():
            v.metadata_props = self.props(fv)

    # -- attributes ---------------------------------------------------------------------------
    def attribute(self, b: GraphBuilder, a: fb.Attribute, owner: str) -> Attribute:
        k = AttrType(a.Type())
        attr = Attribute(self.s(a.Name()), k, ref_attr_name=self.s(a.RefAttrName()),
                         doc_string=self.s(a.DocString()))
        if attr.ref_attr_name:
            return attr
        if k == AttrType.FLOAT:
            attr.value = a.F()
        elif k == AttrType.INT:
            attr.value = a.I()
        elif k == AttrType.STRING:
            attr.value = a.SAsNumpy().tobytes() if a.SLength() else b""
        elif k == AttrType.TENSOR:
            attr.value = self.tensor(self.need(a.T(), attr.name))
        elif k == AttrType.GRAPH:
            g = self.need(a.G(), attr.name)
            attr.value = self.graph(g, b.child(self.s(g.Name()), attr.name, owner))
        elif k == AttrType.FLOATS:
            attr.value = a.FloatsAsNumpy().tolist() if a.FloatsLength() else []
        elif k == AttrType.INTS:
            attr.value = a.IntsAsNumpy().tolist() if a.IntsLength() else []
        elif k == AttrType.STRINGS:
            attr.value = [self.bytes_(a.Strings(j)) for j in range(a.StringsLength())]
        elif k == AttrType.TENSORS:
            attr.value = [self.tensor(a.Tensors(j)) for j in range(a.TensorsLength())]
        elif k == AttrType.GRAPHS:
            attr.value = [self.graph(g, b.child(self.s(g.Name()), attr.name, owner))
                          for g in (a.Graphs(j) for j in range(a.GraphsLength()))]
        elif k == AttrType.SPARSE_TENSOR:
            attr.value = self.sparse(self.need(a.SparseTensor(), attr.name))
        elif k == AttrType.SPARSE_TENSORS:
            attr.value = [self.sparse(a.SparseTensors(j)) for j in range(a.SparseTensorsLength())]
        elif k == AttrType.TYPE_PROTO:
            attr.value = self.type(self.need(a.Tp(), attr.name), 0)
        elif k == AttrType.TYPE_PROTOS:
            attr.value = [self.type(a.TypeProtos(j), 0) for j in range(a.TypeProtosLength())]
        else:
            raise self.bad(f"{owner}: attribute {attr.name!r} has no type")
        return attr

    def need(self, x, what: str):  # noqa: ANN001, ANN202
        if x is None:
            raise self.bad(f"attribute {what!r} lacks its value")
        return x

    @staticmethod
    def bytes_(bt: fb.Bytes) -> bytes:
        return bt.DataAsNumpy().tobytes() if bt.DataLength() else b""

    # -- tensors, types -----------------------------------------------------------------------
    def tensor(self, t: fb.Tensor) -> Tensor:
        name = self.s(t.Name())
        dt = DataType(t.Dtype())
        dims = t.DimsAsNumpy().tolist() if t.DimsLength() else []
        if any(d < 0 for d in dims):
            raise self.bad(f"tensor {name!r}: negative dimension in {dims}")
        numel = 1
        for d in dims:
            numel *= d
        doc, props = self.s(t.DocString()), self.props(t)
        if dt == DataType.STRING:
            strings = [self.bytes_(t.StringData(j)) for j in range(t.StringDataLength())]
            if len(strings) != numel:
                raise self.bad(f"tensor {name!r}: {len(strings)} strings for dims {dims}")
            return Tensor(name, dt, dims, string_data=strings, doc_string=doc, metadata_props=props)
        if dt == DataType.UNDEFINED:
            raise self.bad(f"tensor {name!r}: data type UNDEFINED")
        offset, length = t.Offset(), t.Length()
        if length != dt.nbytes(numel):
            raise self.bad(f"tensor {name!r}: record of {length} bytes, dims {dims} of {dt.name} "
                           f"need {dt.nbytes(numel)}")
        if offset % self.alignment:
            raise self.bad(f"tensor {name!r}: offset {offset} is not {self.alignment}-byte aligned")
        if offset + length > len(self.data):
            raise self.bad(f"tensor {name!r}: bytes [{offset}, {offset + length}) lie outside the "
                           f"data section ({len(self.data)} bytes)")
        if length:
            self.extents.append((offset, length, name))
        tensor = Tensor(name, dt, dims, self.data[offset:offset + length], doc_string=doc,
                        metadata_props=props)
        if self.source is not None:
            tensor.source = (self.source[0], self.source[1] + offset)
        return tensor

    def check_overlaps(self) -> None:
        end, last = 0, ""
        for offset, length, name in sorted(self.extents):
            if offset < end:
                raise self.bad(f"weight records {last!r} and {name!r} overlap")
            end, last = offset + length, name

    def sparse(self, s: fb.SparseTensor) -> SparseTensor:
        dims = tuple(s.DimsAsNumpy().tolist()) if s.DimsLength() else ()
        return SparseTensor(self.tensor(s.Values()), self.tensor(s.Indices()), dims)

    def type(self, t: fb.Type, depth: int) -> Type:
        if depth > MAX_SUBGRAPH_DEPTH:
            raise self.bad("types nested too deeply")
        den = self.s(t.Denotation())
        kind = t.Kind()
        inner = t.ValueType()
        elem = self.type(inner, depth + 1) if inner is not None else None
        if kind in (fb.TypeKind.TENSOR, fb.TypeKind.SPARSE_TENSOR):
            shape = denots = None
            if t.HasShape():
                dims = [t.Dims(j) for j in range(t.DimsLength())]
                shape = tuple(self.dim(d) for d in dims)
                names = tuple(self.s(d.Denotation()) for d in dims)
                denots = names if any(names) else None
            return TensorType(DataType(t.ElemType()), shape, denots, den,
                              sparse=kind == fb.TypeKind.SPARSE_TENSOR)
        if kind == fb.TypeKind.SEQUENCE:
            return SequenceType(elem, den)
        if kind == fb.TypeKind.OPTIONAL:
            return OptionalType(elem, den)
        if kind == fb.TypeKind.MAP:
            return MapType(DataType(t.KeyType()), elem, den)
        if kind == fb.TypeKind.NONE:
            return NoType(den)
        raise self.bad(f"unknown type kind {kind}")

    def symbol(self, idx: int) -> str:
        if idx >= len(self.symbols):
            raise self.bad(f"symbol index {idx} outside the symbol table ({len(self.symbols)})")
        return self.symbols[idx]

    def dim(self, d: fb.Dim) -> Dim:
        kind = d.Kind()
        if kind == fb.DimKind.UNKNOWN:
            return None
        if kind == fb.DimKind.CONSTANT:
            if d.Value() < 0:
                raise self.bad(f"negative dimension {d.Value()}")
            return d.Value()
        if kind == fb.DimKind.SYMBOL:
            return self.symbol(d.Symbol())
        if kind == fb.DimKind.EXPR and d.Expr() is not None:
            return self.expr(d.Expr(), 0)
        raise self.bad(f"bad dimension kind {kind}")

    def expr(self, e: fb.ShapeExpr, depth: int) -> Dim:
        if depth > 64:
            raise self.bad("shape expression nested too deeply")
        op = e.Op()
        if op == fb.ExprOp.CONST:
            return e.Value()
        if op == fb.ExprOp.SYMBOL:
            return self.symbol(e.Symbol())
        if op not in _EXPR_OPS or e.Lhs() is None or e.Rhs() is None:
            raise self.bad(f"bad shape expression (op {op})")
        return ShapeExpr(_EXPR_OPS[op], self.expr(e.Lhs(), depth + 1), self.expr(e.Rhs(), depth + 1))
