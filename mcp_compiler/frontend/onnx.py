"""ONNX -> IR: load (with checked external data), onnx.checker, shape inference, import."""

from __future__ import annotations

import functools
import mmap
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from ..errors import InvalidModelError, McpError, UnsupportedError, one_line
from ..forked import Beside, can_fork
from ..ir.build import GraphBuilder
from ..ir.graph import Attribute, AttrType, Function, Graph, Model, Value
from ..ir.tensor import SparseTensor, Tensor
from ..ir.types import DataType, MapType, NoType, OptionalType, SequenceType, TensorType, Type

# Deeper nesting of subgraphs than this is refused rather than recursed into.
MAX_SUBGRAPH_DEPTH = 64


@dataclass
class LoadedModel:
    model: Model
    path: Path
    warnings: list[str] = field(default_factory=list)
    external_files: list[Path] = field(default_factory=list)


def load_onnx(path: str | os.PathLike, *, check: bool = True, infer_shapes: bool = True,
              beside: bool | None = None) -> LoadedModel:
    """Load an ONNX file into the IR.

    External data is validated (it must lie inside the model's folder, be a regular file with a
    single link, and hold the bytes the tensor claims) and then mapped, not read.

    onnx's checker and shape inference run in a process beside this one (`beside`; by default for
    a main graph of 20k nodes or more, where a fork is safe: see mcp_compiler.forked) while the
    main graph's inputs, weights and nodes are imported here, from the file; the values' inferred
    types are taken when both are done.
    The result, errors and warnings are those of running one after the other: the checker's
    refusal comes first.

    Raises:
        InvalidModelError: the file is missing, corrupt, fails onnx.checker, or refers outside.
        UnsupportedError: the model uses an ONNX feature the IR does not carry.
    """
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise InvalidModelError(path, f"cannot read model: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidModelError(path, "not a regular file")
    if st.st_size == 0:
        raise InvalidModelError(path, "file is empty")
    try:
        proto = onnx.ModelProto.FromString(path.read_bytes())
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidModelError(path, f"not a valid ONNX protobuf ({e})") from None
    if not proto.HasField("graph"):
        raise InvalidModelError(path, "not an ONNX model: it has no graph")

    newest = onnx.defs.onnx_opset_version()
    for o in proto.opset_import:
        _text(o.domain, "an opset_import domain", path)
        if o.domain in ("", "ai.onnx") and not 1 <= o.version <= newest:
            raise InvalidModelError(path, f"imports ai.onnx opset {o.version}, which does not exist "
                                          f"(this onnx knows 1..{newest})")
    try:
        return _load(path, proto, check, infer_shapes, beside)
    except InvalidModelError as e:
        # nodes listed out of order (onnxruntime runs such graphs): sorted, then loaded again. The
        # check costs nothing on a graph in order (the checker and the importer find it), where a
        # look at every node first was a tenth of the conversion at 50k nodes.
        if not _out_of_order(str(e)) or not sort_nodes(proto.graph, path):
            raise
    return _load(path, proto, check, infer_shapes, beside)


def _out_of_order(message: str) -> bool:
    return "topologically sorted" in message or "uses undefined value" in message


def _load(path: Path, proto: onnx.ModelProto, check: bool, infer_shapes: bool, beside: bool | None) -> LoadedModel:
    ext = _ExternalData(path.parent)
    declared = len(proto.graph.value_info) > 0   # before shape inference adds its own
    for t in _all_tensor_protos(proto):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            ext.check(t)

    # The checker and shape inference serialize the whole model (twice each): hand them a copy
    # with the big initializers and Constants as typed graph inputs instead, then put the weights
    # back.
    light, added, moved = _without_big_tensors(proto) if not ext.files else (proto, [], set())
    if beside is None:   # a fork costs some 7 ms here (its page tables, its exit): it pays from ~10k nodes
        beside = can_fork() and len(proto.graph.node) >= _BESIDE_MIN_NODES
    fork = (check or infer_shapes) and beside
    verdict = Beside(functools.partial(_verdict, path, light, check, infer_shapes, bool(ext.files)), fork=fork)
    importer = _Importer(path, ext)
    body = None
    if verdict.forked:
        try:
            body = importer.main_body(proto)
        except _NeedsInferred:   # a subgraph: imported from the inferred model, which carries its shapes
            pass
        except (InvalidModelError, UnsupportedError) as e:
            refused = verdict.result()[0]   # the checker's verdict first, as when run before
            raise (_refused(path, refused) if refused else _with_path(e, path)) from None
        except BaseException:
            verdict.wait()   # (an interrupt, our bug) the child ends before this does
            raise
    refused, failed, inferred = verdict.result()
    if refused:
        raise _refused(path, refused)
    warnings = [f"ONNX shape inference failed, shapes kept as given: {failed}"] if failed else []
    if body is not None:   # the main graph's outputs, value types and functions from the inferred model
        proto = inferred if inferred is not None else proto
    elif inferred is not None and light is not proto:   # (a merge that fails is our bug: not a warning)
        importer.main_initializers = proto.graph.initializer
        importer.main_nodes = _merged_nodes(proto.graph.node, inferred.graph.node, moved)
        proto = _drop_inputs(inferred, added)
    elif inferred is not None:
        proto = inferred
    del light, inferred
    try:
        model = importer.model(proto, body)
    except InvalidModelError as e:
        raise _with_path(e, path) from None
    from ..lower import DECLARED_SHAPES  # the lowered model declares inner shapes as this one did

    model.metadata_props.pop(DECLARED_SHAPES, None)
    if declared:
        model.metadata_props[DECLARED_SHAPES] = "1"
    return LoadedModel(model, path, warnings, list(ext.files))


def _verdict(path: Path, light: onnx.ModelProto, check: bool, infer: bool,
             external: bool) -> tuple[str | None, str | None, onnx.ModelProto | None]:
    """What onnx says of the model: (the checker's refusal, shape inference's failure, the
    inferred model), the two messages' first lines."""
    if check:
        try:
            onnx.checker.check_model(str(path) if external else light)
        except (onnx.checker.ValidationError, RuntimeError, ValueError) as e:
            return one_line(str(e)) or type(e).__name__, None, None
    if not infer:
        return None, None, None
    try:
        return None, None, onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
    except Exception as e:  # noqa: BLE001 - onnx raises many kinds; the model is still usable
        return None, one_line(str(e)) or type(e).__name__, None


def sort_nodes(g: onnx.GraphProto, path: object = None, depth: int = 0) -> bool:
    """Put the nodes of `g` and of every subgraph in an order where each comes after what it
    uses (onnxruntime runs graphs listed in any order; ONNX's checker and our passes need this
    one). A graph already in order, the usual case, is only read. Nodes stay in their listed order
    wherever that order allows (a stable sort); a node that uses a value of the outer graph inside
    its subgraph waits for it too. A cycle is an error naming a node on it. Returns whether
    anything moved."""
    if depth > MAX_SUBGRAPH_DEPTH:
        return False
    moved = False
    nodes = g.node
    for n in nodes:
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                moved |= sort_nodes(sub, path, depth + 1)
    made = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                made.setdefault(o, i)
    deps = [[made[x] for x in _uses(n) if x in made and made[x] != i] for i, n in enumerate(nodes)]
    if all(d < i for i, ds in enumerate(deps) for d in ds):
        return moved
    import heapq

    users: list[list[int]] = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, ds in enumerate(deps):
        for d in set(ds):
            users[d].append(i)
            waiting[i] += 1
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        stuck = next(nodes[i] for i, w in enumerate(waiting) if w)
        raise InvalidModelError(path, f"the graph{f' {g.name!r}' if g.name else ''} has a cycle: node "
                                      f"{stuck.name or '(unnamed)'!r} ({stuck.op_type}) depends on its own output "
                                      "through the nodes it uses")
    kept = [nodes[i] for i in order]
    copies = [onnx.NodeProto() for _ in kept]
    for c, n in zip(copies, kept):
        c.CopyFrom(n)
    del g.node[:]
    g.node.extend(copies)
    return True


def _uses(n: onnx.NodeProto) -> list[str]:
    """The names a node reads: its inputs, and the outer values its subgraphs read."""
    names = [x for x in n.input if x]
    for a in n.attribute:
        for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            names += _outer_names(sub)
    return names


def _outer_names(g: onnx.GraphProto) -> list[str]:
    defined = {v.name for v in g.input} | {t.name for t in g.initializer} | \
              {t.values.name for t in g.sparse_initializer}
    out = []
    for n in g.node:
        for x in _uses(n):
            if x not in defined:
                out.append(x)
        defined.update(n.output)
    return out


def _refused(path: Path, why: str) -> InvalidModelError:
    return InvalidModelError(path, f"onnx.checker rejected the model: {why}")


def _with_path(e: InvalidModelError | UnsupportedError, path: Path) -> McpError:
    if isinstance(e, InvalidModelError) and e.path is None:
        return InvalidModelError(path, e.reason)
    return e


class _NeedsInferred(Exception):
    """The main graph has a subgraph: its import waits for the inferred model."""


# Main-graph nodes from which onnx's checks run in a process beside the import (by default):
# measured on deep chains, 4 ms saved of 130 at 10k nodes, 125 of 750 at 50k; 7-11 ms lost on
# 600-900-node models.
_BESIDE_MIN_NODES = 20_000
_BIG_TENSOR = 1 << 16   # bytes; smaller ones stay (shape inference reads shapes from them)


def _without_big_tensors(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], set[int]]:
    """A model like `proto` whose large main-graph initializers and Constant nodes are graph
    inputs of their type (built field by field: the weights are never copied), the inputs it
    added, and the indexes of the Constant nodes it left out. (Exporters such as paddle2onnx put
    every weight in a Constant: 10 MB serialized four times was a third of a small model's load.)"""
    g = proto.graph
    big = {t.name for t in g.initializer if t.ByteSize() > _BIG_TENSOR}
    inputs = {vi.name for vi in g.input}
    taken = inputs | {t.name for t in g.initializer}   # a Constant redefining one stays for the checker
    moved = {i for i, n in enumerate(g.node) if _big_constant(n) and n.output[0] not in taken}
    if not big and not moved:
        return proto, [], set()
    light = onnx.ModelProto()
    _copy_fields(light, proto, skip=("graph",))
    _copy_fields(light.graph, g, skip=("initializer", "node"))
    light.graph.initializer.extend(t for t in g.initializer if t.name not in big)
    light.graph.node.extend(n for i, n in enumerate(g.node) if i not in moved)
    make = onnx.helper.make_tensor_value_info
    stand_ins = [make(t.name, t.data_type, t.dims) for t in g.initializer if t.name in big and t.name not in inputs]
    stand_ins += [make(g.node[i].output[0], g.node[i].attribute[0].t.data_type, g.node[i].attribute[0].t.dims)
                  for i in sorted(moved)]
    light.graph.input.extend(stand_ins)
    return light, [vi.name for vi in stand_ins], moved


def _big_constant(n: onnx.NodeProto) -> bool:
    """A Constant of the default domain holding one large `value` tensor, and nothing else."""
    return (n.op_type == "Constant" and n.ByteSize() > _BIG_TENSOR and n.domain in ("", "ai.onnx")
            and len(n.output) == 1 and n.output[0] != ""
            and len(n.attribute) == 1 and n.attribute[0].name == "value" and n.attribute[0].HasField("t"))


def _merged_nodes(original, inferred, moved: set[int]) -> list:  # noqa: ANN001 - repeated NodeProto fields
    """The main graph's nodes in their order: the Constants left out of the light model from the
    original, every other one from the inferred model (its subgraphs carry the inferred shapes)."""
    if len(inferred) != len(original) - len(moved):
        raise RuntimeError(f"shape inference returned {len(inferred)} nodes for {len(original) - len(moved)}")
    rest = iter(inferred)
    return [n if i in moved else next(rest) for i, n in enumerate(original)]


def _copy_fields(dst, src, skip: tuple[str, ...]) -> None:  # noqa: ANN001 - two protobuf messages of one type
    """Copy every set field of `src` but those in `skip` into `dst` (repeated ones appended)."""
    for fld, _ in src.ListFields():
        if fld.name in skip:
            continue
        repeated = fld.is_repeated if hasattr(fld, "is_repeated") else fld.label == fld.LABEL_REPEATED
        if repeated:   # protobuf 6.31+ deprecates .label
            getattr(dst, fld.name).extend(getattr(src, fld.name))
        elif fld.message_type:
            getattr(dst, fld.name).CopyFrom(getattr(src, fld.name))
        else:
            setattr(dst, fld.name, getattr(src, fld.name))


def _drop_inputs(inferred: onnx.ModelProto, added: list[str]) -> onnx.ModelProto:
    """`inferred` (made from _without_big_tensors) without the inputs that stood in for the big
    tensors; the importer reads those from the original (_Importer.main_initializers, main_nodes)."""
    gone = set(added)
    keep = [vi for vi in inferred.graph.input if vi.name not in gone]
    del inferred.graph.input[:]
    inferred.graph.input.extend(keep)
    return inferred


def _all_tensor_protos(proto: onnx.ModelProto):  # noqa: ANN202
    def graph(g: onnx.GraphProto, depth: int):  # noqa: ANN202
        if depth > MAX_SUBGRAPH_DEPTH:
            raise InvalidModelError(None, f"subgraphs nested deeper than {MAX_SUBGRAPH_DEPTH}")
        yield from g.initializer
        for s in g.sparse_initializer:
            yield s.values
            yield s.indices
        for n in g.node:
            if len(n.attribute):   # (most nodes have none: no generator for them)
                yield from attrs(n.attribute, depth)

    def attrs(attributes, depth):  # noqa: ANN001, ANN202
        for a in attributes:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
            for s in a.sparse_tensors:
                yield s.values
                yield s.indices
            if a.HasField("g"):
                yield from graph(a.g, depth + 1)
            for sub in a.graphs:
                yield from graph(sub, depth + 1)

    yield from graph(proto.graph, 0)
    for f in proto.functions:
        yield from attrs(f.attribute_proto, 0)
        for n in f.node:
            yield from attrs(n.attribute, 0)


_EXTERNAL_KEYS = frozenset({"location", "offset", "length", "checksum"})
_DIGITS = re.compile(r"[0-9]{1,20}")


class _ExternalData:
    """Checks and maps external-data files; nothing outside `base` is ever opened."""

    def __init__(self, base: Path) -> None:
        self.base = Path(os.path.realpath(base))
        self.files: dict[Path, mmap.mmap | None] = {}

    def _entries(self, t: onnx.TensorProto) -> dict[str, str]:
        return {e.key: e.value for e in t.external_data}

    def resolve(self, t: onnx.TensorProto) -> tuple[Path, int, int | None]:
        info = self._entries(t)
        unknown = sorted(set(info) - _EXTERNAL_KEYS)
        if unknown:
            raise InvalidModelError(None, f"tensor {t.name!r}: unknown external data key {unknown[0]!r} "
                                          f"(onnxruntime knows {', '.join(sorted(_EXTERNAL_KEYS))})")
        loc = info.get("location", "")
        where = f"tensor {t.name!r}: external data location {loc!r}"
        if not loc or "\x00" in loc:
            raise InvalidModelError(None, f"{where} is empty or invalid")
        if os.path.isabs(loc) or loc.startswith(("/", "\\")) or (len(loc) > 1 and loc[1] == ":"):
            raise InvalidModelError(None, f"{where} is an absolute path")
        parts = Path(loc).parts
        if ".." in parts:
            raise InvalidModelError(None, f"{where} escapes the model folder")
        candidate = self.base / loc
        real = Path(os.path.realpath(candidate))
        if real != self.base and self.base not in real.parents:
            raise InvalidModelError(None, f"{where} resolves outside the model folder (symlink?)")
        try:
            st = os.stat(real)
        except OSError:
            raise InvalidModelError(None, f"{where}: file not found") from None
        if not stat.S_ISREG(st.st_mode):
            raise InvalidModelError(None, f"{where} is not a regular file")
        if st.st_nlink > 1:
            raise InvalidModelError(None, f"{where} is a hard link (refused: it may alias a file outside)")
        # ASCII digits only, as onnxruntime parses them: int() would also take " 256 ", "+256",
        # "2_56" and other scripts' digits, which onnxruntime rejects
        for key in ("offset", "length"):
            if key in info and not _DIGITS.fullmatch(info[key]):
                raise InvalidModelError(None, f"tensor {t.name!r}: external data {key} {info[key]!r} is not a "
                                              "non-negative decimal integer")
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
        size = st.st_size
        if length is None:
            length = size - offset
        if offset + length > size:
            raise InvalidModelError(
                None, f"tensor {t.name!r}: external data [{offset}, {offset + length}) runs past the "
                      f"end of {loc!r} ({size} bytes)")
        return real, offset, length

    def check(self, t: onnx.TensorProto) -> None:
        real, _, length = self.resolve(t)
        dt = _data_type(t)
        expected = _expected_nbytes(t, dt)
        if expected is not None and length != expected:
            raise InvalidModelError(
                None, f"tensor {t.name!r}: external data holds {length} bytes, dims "
                      f"{list(t.dims)} of {dt.name} need {expected}")
        self.files.setdefault(real, None)

    def source(self, t: onnx.TensorProto) -> tuple[str, int]:
        real, offset, _ = self.resolve(t)
        return str(real), offset

    def view(self, t: onnx.TensorProto) -> memoryview:
        real, offset, length = self.resolve(t)
        m = self.files.get(real)
        if m is None:
            with open(real, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return memoryview(b"")
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self.files[real] = m
        return memoryview(m)[offset:offset + length]


# data_type codes -> DataType (a dict lookup: the enum's own call by value is ten times slower, once
# per tensor of the model)
_DATA_TYPES = {int(d): d for d in DataType}
_NO_RAW = frozenset({DataType.UNDEFINED, DataType.STRING})


def _data_type(t: onnx.TensorProto) -> DataType:
    dt = _DATA_TYPES.get(t.data_type)
    if dt is None:
        raise InvalidModelError(None, f"tensor {t.name!r}: unknown data type {t.data_type}")
    return dt


def _expected_nbytes(t: onnx.TensorProto, dt: DataType) -> int | None:
    """The bytes t's dims of `dt` (its _data_type) take; None for UNDEFINED and STRING."""
    if dt in _NO_RAW:
        return None
    n = 1
    for d in t.dims:
        if d < 0:
            raise InvalidModelError(None, f"tensor {t.name!r}: negative dimension in {list(t.dims)}")
        n *= d
    return dt.nbytes(n)


class _Importer:
    def __init__(self, path: Path, ext: _ExternalData) -> None:
        self.path = path
        self.ext = ext
        # a serialized TypeProto -> its type: types are immutable, and values of one type share one
        # object (most values of a graph have one of a few types)
        self.by_bytes: dict[bytes, Type] = {}
        self.main_initializers = None   # the main graph's initializers, when not in the proto
        self.main_nodes = None          # and its nodes
        self.defer_subgraphs = False    # main_body: stop at a subgraph

    # -- model, functions ---------------------------------------------------------------------
    def main_body(self, p: onnx.ModelProto) -> GraphBuilder:
        """The main graph's inputs, initializers and nodes (while the model is inferred beside);
        raises _NeedsInferred at a subgraph (its shapes come from the inferred model)."""
        self.defer_subgraphs = True
        try:
            return self.body(p.graph, None, "graph")
        finally:
            self.defer_subgraphs = False

    def model(self, p: onnx.ModelProto, body: GraphBuilder | None = None) -> Model:
        """The model; the main graph's outputs and value types from `p` where `body` (main_body)
        has its nodes."""
        for fld in ("training_info",):
            if len(getattr(p, fld)):
                raise UnsupportedError(f"ONNX ModelProto.{fld} is not supported")
        if hasattr(p, "configuration") and len(p.configuration):
            raise UnsupportedError("ONNX ModelProto.configuration (multi-device) is not supported")
        opsets: dict[str, int] = {}
        for o in p.opset_import:
            opsets[_text(o.domain, "an opset_import domain")] = o.version
        m = Model(
            graph=self.graph(p.graph, None, "graph") if body is None else self.tail(body, p.graph, "graph"),
            opset_imports=opsets, ir_version=p.ir_version, producer_name=_doc(p.producer_name),
            producer_version=_doc(p.producer_version), domain=_text(p.domain, "the model's domain"),
            model_version=p.model_version, doc_string=_doc(p.doc_string), metadata_props=_props(p.metadata_props),
        )
        m.functions = [self.function(f) for f in p.functions]
        if m.ir_version < 4:
            _constant_defaults(m)
        return m

    def function(self, f: onnx.FunctionProto) -> Function:
        b = GraphBuilder(_text(f.name, "a function name"), where=f"function {_text(f.domain, 'a function domain')}.{f.name}")
        for name in _texts(f.input, f"an input name of function {f.name!r}:"):
            b.add_input(Value(name))
        for n in f.node:
            self.node(b, n)
        for name in _texts(f.output, f"an output name of function {f.name!r}:"):
            b.add_output(name)
        for vi in f.value_info:
            self._annotate(b.add_value_info(vi.name), vi)
        return Function(
            name=f.name, domain=f.domain, body=b.graph, attributes=list(f.attribute),
            attribute_defaults=[self.attribute(b, a, f.name) for a in f.attribute_proto],
            opset_imports={o.domain: o.version for o in f.opset_import},
            overload=f.overload, doc_string=f.doc_string, metadata_props=_props(f.metadata_props))

    # -- graphs -------------------------------------------------------------------------------
    def graph(self, g: onnx.GraphProto, parent: GraphBuilder | None, where: str,
              builder: GraphBuilder | None = None) -> Graph:
        return self.tail(self.body(g, parent, where, builder), g, where)

    def body(self, g: onnx.GraphProto, parent: GraphBuilder | None, where: str,
             builder: GraphBuilder | None = None) -> GraphBuilder:
        """A graph's inputs, initializers and nodes."""
        b = builder or GraphBuilder(g.name, parent, where=where)
        if b.depth > MAX_SUBGRAPH_DEPTH:
            raise InvalidModelError(None, f"{where}: subgraphs nested deeper than {MAX_SUBGRAPH_DEPTH}")
        if len(g.quantization_annotation):
            raise UnsupportedError(f"{where}: GraphProto.quantization_annotation is not supported")
        for vi in g.input:
            v = Value(_text(vi.name, f"{where}: an input name"))
            self._annotate(v, vi)
            b.add_input(v)
        inits = g.initializer
        if parent is None and self.main_initializers is not None:
            inits, self.main_initializers = self.main_initializers, None
        for t in inits:
            _text(t.name, f"{where}: an initializer name")
            b.add_initializer(Value(t.name, const=self.tensor(t)))
        for s in g.sparse_initializer:
            st = self.sparse(s)
            b.add_initializer(Value(st.name, const=st), sparse=True)
        nodes = g.node
        if parent is None and self.main_nodes is not None:
            nodes, self.main_nodes = self.main_nodes, None
        for n in nodes:
            self.node(b, n)
        return b

    def tail(self, b: GraphBuilder, g: onnx.GraphProto, where: str) -> Graph:
        """A graph's outputs, value types, doc string and metadata."""
        for vi in g.output:
            v = b.add_output(_text(vi.name, f"{where}: an output name"))
            if vi.HasField("type") or v.type is None:
                self._annotate(v, vi, force=True)
        for vi in g.value_info:
            self._annotate(b.add_value_info(_text(vi.name, f"{where}: a value_info name")), vi)
        b.graph.doc_string = _doc(g.doc_string)
        b.graph.metadata_props = _props(g.metadata_props)
        return b.graph

    def node(self, b: GraphBuilder, n: onnx.NodeProto) -> None:
        if len(getattr(n, "device_configurations", ())):
            raise UnsupportedError("NodeProto.device_configurations is not supported",
                                   node=n.name, op=n.op_type)
        op, name, domain, overload = n.op_type, n.name, n.domain, n.overload
        inputs, outputs = list(n.input), list(n.output)
        # (the messages are made only for a field that is not text: an f-string per field per
        # node was a tenth of the import)
        if bytes in (type(op), type(name), type(domain), type(overload)) \
                or bytes in map(type, inputs) or bytes in map(type, outputs):
            _text(op, f"the op_type of node {name!r}")
            _text(name, f"the name of a {op} node")
            _text(domain, f"the domain of node {name or op!r}")
            _text(overload, f"the overload of node {name or op!r}")
            _texts(inputs, f"an input name of node {name or op!r}:")
            _texts(outputs, f"an output name of node {name or op!r}:")
        attrs = [self.attribute(b, a, name or op) for a in n.attribute] if len(n.attribute) else ()
        b.add_node(op, domain, name, inputs, outputs, attrs, overload=overload,
                   doc_string=_doc(n.doc_string),
                   metadata_props=_props(n.metadata_props) if len(n.metadata_props) else None)

    def _annotate(self, v: Value, vi: onnx.ValueInfoProto, force: bool = False) -> None:
        if vi.HasField("type") and (force or v.type is None):
            v.type = self.type(vi.type)
        if force or not v.doc_string:
            v.doc_string = _doc(vi.doc_string)
        if len(vi.metadata_props):
            v.metadata_props = _props(vi.metadata_props)

    # -- attributes ---------------------------------------------------------------------------
    def attribute(self, b: GraphBuilder, a: onnx.AttributeProto, owner: str) -> Attribute:
        kind = _ATTR_TYPES.get(a.type)
        if kind is None:
            raise InvalidModelError(None, f"{owner}: attribute {a.name!r} has an unknown type {a.type}")
        name, ref = a.name, a.ref_attr_name
        if type(name) is bytes or type(ref) is bytes:   # (the messages only then: two f-strings an attribute were a tenth of the import)
            _text(name, f"an attribute name of {owner!r}")
            _text(ref, f"a ref_attr_name of {owner!r}")
        attr = Attribute(name, kind, ref_attr_name=ref, doc_string=_doc(a.doc_string))
        if ref:
            return attr
        if kind == AttrType.FLOAT:
            attr.value = a.f
        elif kind == AttrType.INT:
            attr.value = a.i
        elif kind == AttrType.STRING:
            attr.value = a.s
        elif kind == AttrType.TENSOR:
            attr.value = self.tensor(a.t)
        elif kind in (AttrType.GRAPH, AttrType.GRAPHS) and self.defer_subgraphs:
            raise _NeedsInferred
        elif kind == AttrType.GRAPH:
            attr.value = self.graph(a.g, b, "", b.child(a.g.name, a.name, owner))
        elif kind == AttrType.FLOATS:
            attr.value = list(a.floats)
        elif kind == AttrType.INTS:
            attr.value = list(a.ints)
        elif kind == AttrType.STRINGS:
            attr.value = list(a.strings)
        elif kind == AttrType.TENSORS:
            attr.value = [self.tensor(t) for t in a.tensors]
        elif kind == AttrType.GRAPHS:
            attr.value = [self.graph(g, b, "", b.child(g.name, a.name, owner)) for g in a.graphs]
        elif kind == AttrType.SPARSE_TENSOR:
            attr.value = self.sparse(a.sparse_tensor)
        elif kind == AttrType.SPARSE_TENSORS:
            attr.value = [self.sparse(s) for s in a.sparse_tensors]
        elif kind == AttrType.TYPE_PROTO:
            attr.value = self.type(a.tp)
        elif kind == AttrType.TYPE_PROTOS:
            attr.value = [self.type(t) for t in a.type_protos]
        else:
            raise InvalidModelError(None, f"{owner}: attribute {a.name!r} has no type")
        return attr

    # -- tensors and types --------------------------------------------------------------------
    def tensor(self, t: onnx.TensorProto) -> Tensor:
        if len(t.dims) and t.HasField("segment"):
            raise UnsupportedError(f"tensor {t.name!r}: segmented tensors are not supported")
        dt = _data_type(t)
        expected = _expected_nbytes(t, dt)
        props = _props(t.metadata_props) if len(t.metadata_props) else {}
        if dt == DataType.UNDEFINED:
            raise InvalidModelError(None, f"tensor {t.name!r}: data type UNDEFINED")
        if dt == DataType.STRING:
            n = int(np.prod(t.dims)) if len(t.dims) else 1
            if len(t.string_data) != n:
                raise InvalidModelError(
                    None, f"tensor {t.name!r}: {len(t.string_data)} strings for dims {list(t.dims)}")
            return Tensor(t.name, dt, t.dims, string_data=list(t.string_data),
                          doc_string=t.doc_string, metadata_props=props)
        source = None
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raw: memoryview | bytes = self.ext.view(t)
            source = self.ext.source(t)
        elif t.HasField("raw_data"):
            raw = t.raw_data
        elif dt in (DataType.FLOAT, DataType.DOUBLE):
            raw = _packed_field(t, *((4, 4) if dt == DataType.FLOAT else (10, 8)))
        else:
            try:
                arr = numpy_helper.to_array(t)
            except Exception as e:  # noqa: BLE001 - numpy/onnx raise ValueError, TypeError...
                raise InvalidModelError(None, f"tensor {t.name!r}: bad typed data ({e})") from None
            raw = Tensor.from_numpy(t.name, arr, dt).raw.tobytes()
        if len(raw) != expected:
            raise InvalidModelError(
                None, f"tensor {t.name!r}: holds {len(raw)} bytes, dims {list(t.dims)} of "
                      f"{dt.name} need {expected}")
        tensor = Tensor(t.name, dt, t.dims, raw, doc_string=t.doc_string, metadata_props=props)
        tensor.source = source
        return tensor

    def sparse(self, s: onnx.SparseTensorProto) -> SparseTensor:
        return SparseTensor(self.tensor(s.values), self.tensor(s.indices), tuple(s.dims))

    def type(self, tp: onnx.TypeProto) -> Type:
        """The IR type of `tp`; equal protos (most values of a graph share a few types) are read
        once, found again by their serialized bytes (a C call: a tenth of reading the fields)."""
        raw = tp.SerializeToString()
        made = self.by_bytes.get(raw)
        if made is None:
            made = self.by_bytes[raw] = self._type(tp)
        return made

    def _type(self, tp: onnx.TypeProto, depth: int = 0) -> Type:
        if depth > MAX_SUBGRAPH_DEPTH:
            raise InvalidModelError(None, "type nested too deeply")
        which = tp.WhichOneof("value")
        den = tp.denotation
        if which in ("tensor_type", "sparse_tensor_type"):
            tt = getattr(tp, which)
            shape = None
            denots = None
            if tt.HasField("shape"):
                dims = tt.shape.dim
                shape = tuple([_dim(d) for d in dims])
                if any([d.denotation for d in dims]):
                    denots = tuple(d.denotation for d in dims)
            elem = _DTYPES.get(tt.elem_type)
            if elem is None:
                raise InvalidModelError(None, f"unknown element type {tt.elem_type}")
            return TensorType(elem, shape, denots, den, sparse=which == "sparse_tensor_type")
        if which == "sequence_type":
            e = tp.sequence_type.elem_type
            return SequenceType(self._type(e, depth + 1) if tp.sequence_type.HasField("elem_type") else None, den)
        if which == "optional_type":
            e = tp.optional_type.elem_type
            return OptionalType(self._type(e, depth + 1) if tp.optional_type.HasField("elem_type") else None, den)
        if which == "map_type":
            mt = tp.map_type
            return MapType(DataType(mt.key_type),
                           self._type(mt.value_type, depth + 1) if mt.HasField("value_type") else None, den)
        if which == "opaque_type":
            raise UnsupportedError("opaque types are not supported")
        return NoType(den)


# enum lookups by value (calling the Enum class costs microseconds per value: a second at 100k nodes)
_DTYPES = {int(d): d for d in DataType}
_ATTR_TYPES = {int(a): a for a in AttrType}


def _constant_defaults(m: Model) -> None:
    """Before IR version 4 every initializer had to be listed as a graph input too, and such an
    input is not one a caller may feed (onnxruntime's reading: overridable only from IR 4 on).
    They become plain initializers, and the model IR 4 (which allows initializers that are not
    inputs): the passes may fold them like any constant, and the interface lists what a caller
    gives."""
    weights_not_inputs(m)
    m.ir_version = 4


def weights_not_inputs(model: Model) -> list[str]:
    """Initializers that the main graph also lists as inputs become weights only: the interface
    is what a caller must feed, and the passes may fold them, so weights the folding replaced go
    instead of staying as inputs nothing uses. Returns their names. (Before IR 4 the reading is
    onnxruntime's own; from IR 4 on, convert's default, --initializer-inputs weights.)"""
    g = model.graph
    taken = [v.name for v in g.inputs if v.const is not None]
    if taken:
        g.inputs = [v for v in g.inputs if v.const is None]
    return taken


def _dim(d: onnx.TensorShapeProto.Dimension):  # noqa: ANN202
    if d.WhichOneof("value") == "dim_value":
        v = d.dim_value
        return v if v >= 0 else None
    return d.dim_param or None


def _props(entries) -> dict[str, str]:  # noqa: ANN001
    return {_text(e.key, "a metadata key"): _text(e.value, f"metadata {e.key!r}") for e in entries}


def _packed_field(t: onnx.TensorProto, number: int, itemsize: int) -> bytes:
    """The little-endian bytes of TensorProto field `number` (float_data 4, double_data 10), as
    they are in its wire form (packed: one length-delimited run; or an element at a time, fixed32
    or fixed64). Read through the Python field, element by element, Paddle's exports (every weight
    in float_data) spent 7 ms of a 0.4 s conversion here; serialized, the tensor is one C call."""
    data = t.SerializeToString()
    runs, i, end, groups = [], 0, len(data), 0
    fixed = 5 if itemsize == 4 else 1
    while i < end:
        key, i = _varint(data, i)
        wire = key & 7
        if wire == 0:
            i = _varint(data, i)[1]
            continue
        if wire in (3, 4):   # an unknown field written as a group (kept by the parser): its contents skipped
            groups += 1 if wire == 3 else -1
            continue
        if wire == 2:
            size, i = _varint(data, i)
        else:   # 1: fixed64, 5: fixed32 (the parser accepted no other wire type)
            size = 8 if wire == 1 else 4
        if not groups and key >> 3 == number and wire in (2, fixed):
            runs.append(data[i:i + size])
        i += size
    return b"".join(runs)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _text(value: str | bytes, what: str, path: object = None) -> str:
    """A protobuf string field as str: onnx's proto2 strings are not checked when parsed, and one
    that is not UTF-8 comes back as bytes (json, sorting and the writers then fail)."""
    if type(value) is bytes:
        raise InvalidModelError(path, f"{what} is not valid UTF-8: {value[:40]!r}")
    return value


def _texts(values, what: str) -> list[str]:  # noqa: ANN001 - a repeated string field
    if any(type(v) is bytes for v in values):
        bad = next(v for v in values if type(v) is bytes)
        raise InvalidModelError(None, f"{what} {bad[:40]!r} is not valid UTF-8")
    return list(values)


def _doc(value: str | bytes) -> str:
    """Doc strings are free text: a non-UTF-8 byte is replaced, not an error."""
    return value.decode("utf-8", "replace") if type(value) is bytes else value


IN_MEMORY = "__mcp_in_memory__"   # external-data location naming a Tensor held by the caller


class _InMemoryTensors:
    """Stands in for _ExternalData: `location = IN_MEMORY, offset = i` is the caller's tensors[i]."""

    def __init__(self, tensors: list[Tensor]) -> None:
        self.tensors = tensors
        self.files: dict = {}

    def _get(self, t: onnx.TensorProto) -> Tensor:
        info = {e.key: e.value for e in t.external_data}
        if info.get("location") != IN_MEMORY:
            raise InvalidModelError(None, f"tensor {t.name!r}: unexpected external data {info.get('location')!r}")
        return self.tensors[int(info["offset"])]

    def check(self, t: onnx.TensorProto) -> None:
        self._get(t)

    def source(self, t: onnx.TensorProto) -> tuple[str, int] | None:
        return self._get(t).source

    def view(self, t: onnx.TensorProto) -> memoryview:
        return self._get(t).raw


def to_onnx_by_reference(model: Model) -> tuple[onnx.ModelProto, list[Tensor]]:
    """Lower `model` with every tensor left out of the protobuf (external data naming it), for
    onnx tools that rewrite graphs without touching weights; `import_by_reference` undoes it."""
    from mcp_compiler.lower import to_onnx

    tensors: list[Tensor] = []

    def sink(t: Tensor):  # noqa: ANN202
        if t.string_data is not None:
            return None
        tensors.append(t)
        return (IN_MEMORY, len(tensors) - 1, t.nbytes)

    return to_onnx(model, sink=sink, value_info=True), tensors


def import_by_reference(proto: onnx.ModelProto, tensors: list[Tensor]) -> Model:
    """Import a protobuf made by `to_onnx_by_reference` (and then rewritten): weights are the
    original Tensor objects, not copies."""
    return _Importer(Path(IN_MEMORY), _InMemoryTensors(tensors)).model(proto)
