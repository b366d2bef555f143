"""Rewrite what the target runtime has no kernel for into what it has, exactly."""

from __future__ import annotations

import itertools

import onnx
from onnx import TensorProto as TP

from mcp_compiler.errors import UnsupportedError
from mcp_compiler.ir import Attribute, AttrType, DataType, Graph, Model, Node, TensorType, Value
from mcp_compiler.lower import _Lowering, type_proto
from mcp_compiler.targets.ort_support import key, since_version

from .._infra import Pass, PassContext, PassResult, Property

# Widening that computes the same values: ints to int32 and back wrap like the narrow op
# (ONNX integer arithmetic is modular; Cast to a narrower int wraps); float16/bfloat16 through
# float32 and back rounds +, -, *, / correctly (float32 has >= 2p+2 bits of either).
_WIDER = {TP.INT8: TP.INT32, TP.UINT8: TP.INT32, TP.INT16: TP.INT32, TP.UINT16: TP.INT32,
          TP.UINT32: TP.INT64, TP.BFLOAT16: TP.FLOAT, TP.FLOAT16: TP.FLOAT}
# op -> the type parameter whose inputs/outputs go through the wider type
_WIDENABLE = {op: "T" for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs", "Expand",
                                 "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                                 "Relu", "Sum", "Tile", "Pad", "Concat", "Transpose", "Reshape")}
_WIDENABLE["Pow"] = "T1"   # only the exponent: its integer values are the same in int32/int64
# float16/bfloat16 only: computed in float32 and rounded once, as kernels of these types do
_FLOAT_ONLY = {"MatMul", "Softmax", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Elu", "Erf",
               "Reciprocal", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "Trilu", "Gelu"}
_WIDENABLE.update({op: "T" for op in _FLOAT_ONLY})
# Float-only rounding matters for these when widened from float16/bfloat16: leave them out.
_INTEGER_ONLY = {"Sum"}
# Downgrading across these versions changes semantics with the same signature.
_SEMANTIC_CHANGES = {("Softmax", 13), ("LogSoftmax", 13), ("Hardmax", 13)}


class LegalizePass(Pass):
    """Rules, in order, for nodes the target runtime's support table says it cannot run:

    - opset downgrade: the model's ai.onnx opset -> the newest older one at which every node has
      the same signature (attributes, inputs, outputs, its types allowed) and fewer nodes lack a
      kernel; ops whose meaning changed between the two (Softmax at 13, ...) block it
    - function body: an op whose schema carries an ONNX function body (Swish, CastLike, ...)
      -> that body, inlined (onnx.defs), when the body's ops mean the same at the model's opset
    - widen: integer or float16/bfloat16 element types the kernel lacks -> Cast to int32/int64/
      float32, the op, Cast back, for ops where that is exact (Add, Max, Expand, ...; Pow's exponent)
    - anything else: listed with node, op, opset and dtypes ("no rule"); with `strict` (the
      target's pipeline) conversion stops naming every such node

    Nodes whose types are unknown, or that the probe cannot judge, are left as they are.
    """

    name = "legalize"
    requires = frozenset({Property.NO_CONSTANT_NODES})
    establishes = frozenset()   # target-legal when strict: what is left raises
    preserves = frozenset({Property.NO_CONSTANT_NODES, Property.NO_DEAD_CODE, Property.LAYOUT_NHWC})
    idempotent = True

    def __init__(self, table=None, strict: bool = False) -> None:  # noqa: ANN001
        self.table = table
        self.strict = strict
        if strict:
            self.establishes = frozenset({Property.TARGET_LEGAL})

    def _start(self, model: Model, table) -> None:  # noqa: ANN001
        if table is None:
            from mcp_compiler.targets.ort_support import SupportTable

            table = SupportTable()
        self.t = table
        self.model = model
        self.rows: list[dict] = []
        self.fresh = itertools.count()
        self._memo: dict[tuple, bool | None] = {}

    def illegal(self, model: Model, table=None) -> list[str]:  # noqa: ANN001
        """The nodes the table says have no kernel (what target-legal rules out)."""
        self._start(model, table or self.table)
        return [f"{n.name or '(unnamed)'}: {self._describe(n)['op']} {self._describe(n)['dtypes']} has no kernel"
                for g in model.all_graphs() for n in g.nodes if self._supported(g, n) is False]

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        self._start(model, self.table or getattr(ctx.target, "support", None))
        table = self.t
        nodes = [(g, n) for g in model.all_graphs() for n in g.nodes]
        status = [self._supported(g, n) for g, n in nodes]
        changed = self._downgrade(nodes, status)
        if changed:
            status = [self._supported(g, n) for g, n in nodes]
        pending = [(g, n) for (g, n), ok in zip(nodes, status) if ok is False]
        depth = {id(n): 0 for _, n in pending}
        unresolved = []
        while pending:
            g, n = pending.pop(0)
            new = self._inline(g, n) if depth[id(n)] < 4 else None
            if new is not None:
                changed = True
                for m in new:
                    depth[id(m)] = depth[id(n)] + 1
                    if self._supported(g, m) is False:
                        pending.append((g, m))
                continue
            if self._widen(g, n):
                changed = True
                continue
            unresolved.append(n)
            self.rows.append({**self._describe(n), "rule": "no rule"})
        if unresolved and self.strict:
            rows = [r for r in self.rows if r["rule"] == "no rule"]
            listed = "; ".join(f"{r['node'] or '(unnamed)'}: {r['op']}({r['opset']}) {r['dtypes']}" for r in rows[:8])
            more = f" and {len(rows) - 8} more" if len(rows) > 8 else ""
            raise UnsupportedError(f"{len(rows)} node(s) that {table.runtime} has no kernel for and no rule "
                                   f"makes legal: {listed}{more}")
        if self.strict and ctx.target is not None:
            ctx.target.check_ops(model)   # what no rule here covers (operator domains)
        stats = {"rules_fired": sum(r["rule"] != "no rule" for r in self.rows),
                 "no_rule": len(unresolved), "probes": table.probed}
        return PassResult(model, changed, stats, details=self.rows)

    # -- support ---------------------------------------------------------------------------------
    def _opsets(self) -> dict[str, int]:
        imports = self.model.opset_imports
        if getattr(self, "_opsets_for", None) != imports:
            self._opsets_for = dict(imports)
            self._opsets_cache = {("" if d == "ai.onnx" else d): v for d, v in imports.items()}
        return self._opsets_cache

    def _supported(self, g: Graph, n: Node, opsets: dict[str, int] | None = None,
                   types: tuple[list, list] | None = None) -> bool | None:
        if not n.is_onnx():
            return None
        for a in n.attributes.values():
            if a.type in (AttrType.GRAPH, AttrType.GRAPHS):
                return None
        opsets = opsets or self._opsets()
        memo = None
        if types is None:   # the table's key straight from the IR: no lowering for known nodes
            ins = tuple(_elem(v) if v is not None else 0 for v in n.inputs)
            outs = tuple(_elem(v) for v in n.outputs)
            if None not in ins and None not in outs:
                memo = (n.op_type, opsets.get("", 1), ins, outs)
                if memo in self._memo:
                    return self._memo[memo]
                version = since_version("", n.op_type, opsets.get("", 1))
                known = self.t.kernels.get(key("", n.op_type, version, ins, outs)) if version else None
                if known is not None:
                    self._memo[memo] = known
                    return known
        low = _Lowering(None)
        proto = low.node(n)
        ins, outs = types or ([_type(v) for v in n.inputs], [_type(v) for v in n.outputs])
        consts = {v.name: low.tensor(v.const) for v in n.inputs
                  if v is not None and v.const is not None and v.const.nbytes <= 4096 and hasattr(v.const, "raw")}
        result = self.t.supports(proto, ins, outs, opsets, consts)
        if memo is not None and not consts:   # constant inputs can decide a probe: not memoized
            self._memo[memo] = result
        return result

    def _describe(self, n: Node) -> dict:
        opset = self._opsets().get(n.domain or "", 1)
        return {"node": n.name, "op": n.op_type, "opset": since_version(n.domain, n.op_type, opset) or opset,
                "dtypes": ",".join(_dtype(v) for v in n.inputs) + "->" + ",".join(_dtype(v) for v in n.outputs)}

    # -- opset downgrade ----------------------------------------------------------------------------
    def _downgrade(self, nodes: list, status: list) -> bool:
        opsets = self._opsets()
        have = opsets.get("")
        bad_now = sum(ok is False for ok in status)
        if have is None or self.model.functions or (not bad_now and have <= self.t.max_opset):
            return False
        if any(n.is_onnx() and any(n.subgraphs()) for _, n in nodes):
            return False
        best = None
        for low in range(min(have - 1, self.t.max_opset), max(have - 8, 6), -1):
            if not all(_same_meaning(n, have, low) for _, n in nodes if n.is_onnx()):
                break   # an older opset only loses more ops
            trial = {**opsets, "": low}
            bad = sum(self._supported(g, n, trial) is False for g, n in nodes)
            if bad < bad_now or have > self.t.max_opset:
                best = low
                break
        if best is None:
            return False
        low = best
        dom = "" if "" in self.model.opset_imports else "ai.onnx"
        changed = [n for _, n in nodes if n.is_onnx()
                   and since_version("", n.op_type, have) != since_version("", n.op_type, low)]
        self.model.opset_imports[dom] = low
        for n in changed:
            self.rows.append({**self._describe(n), "rule": f"opset downgrade {have} -> {low}",
                              "opset": since_version("", n.op_type, have)})
        if not changed:
            self.rows.append({"node": "", "op": "", "opset": have, "dtypes": "",
                              "rule": f"opset downgrade {have} -> {low}"})
        return True

    # -- function bodies ----------------------------------------------------------------------------
    def _inline(self, g: Graph, n: Node) -> list[Node] | None:
        from mcp_compiler.frontend.onnx import import_by_reference

        opset = self._opsets().get("", 1)
        try:
            schema = onnx.defs.get_schema(n.op_type, opset, "")
        except onnx.defs.SchemaError:
            return None
        low = _Lowering(None)
        proto = low.node(n)
        in_types = [_type(v) for v in n.inputs]
        fp = None
        if schema.has_function:
            fp = schema.get_function_with_opset_version(opset) or schema.function_body
            fp = fp if isinstance(fp, onnx.FunctionProto) else onnx.FunctionProto.FromString(fp)
        elif schema.has_context_dependent_function:
            if any(t is None for t, v in zip(in_types, n.inputs) if v is not None):
                return None
            raw = schema.get_context_dependent_function_with_opset_version(
                opset, proto.SerializeToString(),
                [(t or onnx.TypeProto()).SerializeToString() for t in in_types])
            fp = onnx.FunctionProto.FromString(raw) if raw else None
        if fp is None or not len(fp.node):
            return None
        body_opset = next((o.version for o in fp.opset_import if o.domain in ("", "ai.onnx")), opset)
        for b in fp.node:
            if b.domain not in ("", "ai.onnx") or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                      for a in b.attribute):
                return None
            if not _same_signature(b.op_type, opset, body_opset):
                return None
        prefix = f"{n.name or n.op_type}__{next(self.fresh)}__"
        rename = {f: (proto.input[i] if i < len(proto.input) else "") for i, f in enumerate(fp.input)}
        rename.update({f: proto.output[i] for i, f in enumerate(fp.output) if i < len(proto.output)})
        attrs = {a.name: a for a in proto.attribute}
        nodes = []
        for k, b in enumerate(fp.node):
            c = onnx.NodeProto()
            c.CopyFrom(b)
            c.name = f"{prefix}{b.name or b.op_type}_{k}"
            c.input[:] = [rename.get(x, f"{prefix}{x}") if x else "" for x in b.input]
            c.output[:] = [rename.get(x, f"{prefix}{x}") if x else "" for x in b.output]
            del c.attribute[:]
            for a in b.attribute:
                if a.ref_attr_name:
                    src = attrs.get(a.ref_attr_name)
                    if src is None:
                        default = schema.attributes.get(a.ref_attr_name)
                        if default is None or not default.default_value.name:
                            continue
                        src = default.default_value
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(src)
                    a2.name = a.name
                    c.attribute.append(a2)
                else:
                    c.attribute.append(a)
            nodes.append(c)
        outer = [v for v in n.inputs if v is not None]
        typed = []
        for v in outer:
            vi = onnx.ValueInfoProto(name=v.name)
            if _type(v) is not None:
                vi.type.CopyFrom(_type(v))
            typed.append(vi)
        mini = onnx.helper.make_graph(nodes, "inline", typed, [low.value_info(v) for v in n.outputs])
        m = onnx.helper.make_model(mini, opset_imports=[onnx.helper.make_opsetid("", opset)])
        m.ir_version = max(self.model.ir_version, 8)
        try:
            m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
            sub = import_by_reference(m, []).graph
        except Exception:  # noqa: BLE001 - the body does not type-check here: not applied
            return None
        # Wire the body into g: its inputs are n's inputs, its outputs become n's outputs.
        if any(sv.producer is None for sv in sub.outputs):
            return None
        by_name = {v.name: v for v in outer}
        for sv in sub.inputs:
            for user, idx in list(sv.uses):
                user.set_input(idx, by_name[sv.name])
        outs = list(n.outputs)
        real_of = {id(sv): real for sv, real in zip(sub.outputs, outs)}
        for real in outs:
            real.producer = None
        n.outputs = []
        for i in range(len(n.inputs)):
            n.set_input(i, None)
        for body in sub.nodes:
            for j, o in enumerate(body.outputs):
                real = real_of.get(id(o))
                if real is not None:
                    body.outputs[j] = real
                    real.producer, real.output_index = body, j
                    for user, idx in list(o.uses):
                        user.set_input(idx, real)
        g.nodes[g.nodes.index(n):g.nodes.index(n) + 1] = sub.nodes
        self.rows.append({**self._describe_removed(n, outs), "rule": f"function body ({len(sub.nodes)} nodes)"})
        return sub.nodes

    def _describe_removed(self, n: Node, outs: list[Value]) -> dict:
        return {"node": n.name, "op": n.op_type, "opset": self._describe(n)["opset"],
                "dtypes": "->" + ",".join(_dtype(v) for v in outs)}

    # -- dtype widening ------------------------------------------------------------------------------
    def _widen(self, g: Graph, n: Node) -> bool:
        param = _WIDENABLE.get(n.op_type)
        if param is None:
            return False
        opset = self._opsets().get("", 1)
        schema = onnx.defs.get_schema(n.op_type, opset, "")
        formal_in = _formals(schema.inputs, len(n.inputs))
        formal_out = _formals(schema.outputs, len(n.outputs))
        ins = [v for v, f in zip(n.inputs, formal_in) if v is not None and f == param]
        outs = [v for v, f in zip(n.outputs, formal_out) if f == param]
        if not ins:
            return False
        elem = {_elem(v) for v in ins + outs}
        if len(elem) != 1 or None in elem:
            return False
        narrow = elem.pop()
        wide = _WIDER.get(narrow)
        floaty = narrow in (TP.FLOAT16, TP.BFLOAT16)
        if wide is None or (n.op_type in _INTEGER_ONLY and floaty) or (n.op_type in _FLOAT_ONLY and not floaty):
            return False
        # would the widened node have a kernel?
        t_in = [_retyped(v, wide) if v is not None and v in ins else _type(v) for v in n.inputs]
        t_out = [_retyped(v, wide) if v in outs else _type(v) for v in n.outputs]
        if self._supported(g, n, types=(t_in, t_out)) is not True:
            return False
        before = self._describe(n)
        at = g.nodes.index(n)
        pre, post = [], []
        for i, v in enumerate(n.inputs):
            if v is not None and v in ins:
                w = Value(f"{v.name}__{next(self.fresh)}_wide", TensorType(DataType(wide), _shape(v)))
                pre.append(Node("Cast", [v], [w], name=f"{n.name or n.op_type}__{next(self.fresh)}_widen_{i}",
                                attributes=[Attribute("to", AttrType.INT, wide)]))
                n.set_input(i, w)
        for j, y in enumerate(list(n.outputs)):
            if y not in outs:
                continue
            w = Value(f"{y.name}__{next(self.fresh)}_wide", TensorType(DataType(wide), _shape(y)))
            n.outputs[j] = w
            w.producer, w.output_index = n, j
            y.producer = None
            post.append(Node("Cast", [w], [y], name=f"{n.name or n.op_type}__{next(self.fresh)}_narrow_{j}",
                             attributes=[Attribute("to", AttrType.INT, narrow)]))
        g.nodes[at:at + 1] = [*pre, n, *post]
        self.rows.append({**before, "rule": f"widen {_name(narrow)} -> {_name(wide)}"})
        return True


def _same_meaning(n: Node, have: int, low: int) -> bool:
    """n means the same at opset `low` as at `have`: same signature, its types allowed there."""
    old_v = since_version("", n.op_type, low)
    if old_v is None:
        return False
    if old_v == since_version("", n.op_type, have):
        return True
    if any(a not in onnx.defs.get_schema(n.op_type, low, "").attributes for a in n.attributes):
        return False
    if not _same_signature(n.op_type, have, low):
        return False
    old = onnx.defs.get_schema(n.op_type, low, "")
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in old.type_constraints}
    for formals, values in ((old.inputs, n.inputs), (old.outputs, n.outputs)):
        for f, v in zip(_formals(formals, len(values)), values):
            if v is None or f not in allowed:
                continue
            t = _type(v)
            if t is None:
                return False
            if _type_str(t) not in allowed[f]:
                return False
    return True


def _same_signature(op: str, have: int, low: int) -> bool:
    """op's schema at opset `low` has the attributes, inputs and outputs it has at `have`, and no
    version between them is a known change of meaning (type lists may differ: checked apart)."""
    new_v, old_v = since_version("", op, have), since_version("", op, low)
    if old_v is None or new_v is None:
        return False
    if new_v == old_v:
        return True
    if any((op, v) in _SEMANTIC_CHANGES for v in range(old_v + 1, new_v + 1)):
        return False
    old, new = onnx.defs.get_schema(op, low, ""), onnx.defs.get_schema(op, have, "")
    return (set(old.attributes) == set(new.attributes)
            and [i.name for i in old.inputs] == [i.name for i in new.inputs]
            and [o.name for o in old.outputs] == [o.name for o in new.outputs])


def _formals(params, count: int) -> list[str]:  # noqa: ANN001
    """The type parameter of each of `count` actual inputs/outputs (variadic: the last repeats)."""
    out = []
    for i in range(count):
        p = params[min(i, len(params) - 1)] if params else None
        out.append(p.type_str if p is not None else "")
    return out


def _type(v: Value | None) -> onnx.TypeProto | None:
    if v is None:
        return None
    t = v.type
    if t is None and v.const is not None and hasattr(v.const, "dtype"):
        t = TensorType(v.const.dtype, v.const.dims)
    if t is None:
        return None
    return type_proto(t)


def _retyped(v: Value, elem: int) -> onnx.TypeProto:
    t = _type(v)
    t2 = onnx.TypeProto()
    t2.CopyFrom(t)
    t2.tensor_type.elem_type = elem
    return t2


def _elem(v: Value) -> int | None:
    t = v.type
    if isinstance(t, TensorType) and not t.sparse:
        return int(t.elem_type)
    if t is None and v.const is not None and hasattr(v.const, "dtype"):
        return int(v.const.dtype)
    return None


def _shape(v: Value):  # noqa: ANN202
    return v.type.shape if isinstance(v.type, TensorType) else None


def _dtype(v: Value | None) -> str:
    e = _elem(v) if v is not None else None
    return _name(e) if e else ("" if v is None else "?")


def _name(elem: int) -> str:
    return TP.DataType.Name(elem).lower()


def _type_str(t: onnx.TypeProto) -> str:
    names = {TP.FLOAT: "float", TP.DOUBLE: "double", TP.FLOAT16: "float16", TP.BFLOAT16: "bfloat16",
             TP.BOOL: "bool", TP.STRING: "string", TP.COMPLEX64: "complex64", TP.COMPLEX128: "complex128"}
    e = t.tensor_type.elem_type
    name = names.get(e, TP.DataType.Name(e).lower())
    return f"tensor({name})"


def illegal_nodes(model: Model, table) -> list[str]:  # noqa: ANN001 - ort_support.SupportTable
    """The nodes of `model` that `table`'s runtime has no kernel for."""
    return LegalizePass(table).illegal(model)
