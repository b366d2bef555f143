"""Symbolic shape inference: every value of the main graph gets a shape over the model's symbols."""

from __future__ import annotations

from collections import Counter

from mcp_compiler.ir import DataType, Graph, Model, Node, TensorType, Value
from mcp_compiler.ir.dims import Dim, ShapeExpr, dim_size, dim_symbols

from .._infra import ALL, Pass, PassContext, PassResult, Property
from . import algebra as A
from .rules import SHAPE_RULES, VALUE_RULES, Facts, Shape, Site, initial_values

# A dim whose expression would pass this many nodes written out becomes a fresh symbol (the same
# expression, the same symbol), and what it stands for an assumption: expressions that feed on
# themselves (a concat of a tensor and a strided view of it, layer after layer) double at every
# layer, and nothing downstream (the contracts, the .mcpir, `inspect`) would end.
EXPR_LIMIT = 64

_MALFORMED = (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError, AttributeError)


def unnamed(d: Dim) -> bool:
    """A dim with no usable name: unknown, ONNX's `?`/-1 spellings, or onnx's own `unk__N`."""
    return d is None or (isinstance(d, str) and (d in ("?", "-1", "") or d.startswith("unk__")))


class SymbolicShapesPass(Pass):
    """Propagates shapes through the main graph in node order:

    - graph inputs keep their dims; unnamed ones (`?`, -1, none) get fresh symbols `<input>_d<axis>`
    - each op's rule (passes/shapes/rules.py) computes output dims as expressions over the symbols:
      broadcasting, MatMul/Gemm, Conv/Pool windows (`(H - 1) // 2 + 1`), Resize scales, Reshape
      targets computed from Shape -> Gather -> Concat, Slice, Concat, Split, Pad, reductions, ...
    - where a rule has no answer the model's own dims are kept, unnamed ones get fresh symbols
      `<value>_d<axis>`, and the op is counted under `no_rule`
    - conflicts (two different constants an op needs equal, or a declared constant the rule
      contradicts; the declared one is kept) become warnings; assumptions (two symbolic dims
      an op needs equal) are listed in the stats

    Subgraphs (If/Loop/Scan bodies) and functions keep the shapes ONNX inference gave them.
    """

    name = "infer-shapes"
    requires = frozenset()
    establishes = frozenset({Property.SHAPES_INFERRED})
    preserves = ALL
    idempotent = True

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        opset = model.onnx_opset
        inf = Inference(model.graph, opset, taken=model_symbols(model))
        inf.run()
        changed = inf.write()
        facts = inf.facts
        model.shape_ties = _ties(facts.requires)
        warnings = [f"shape conflict: {c}" for c in facts.conflicts[:10]]
        if len(facts.conflicts) > 10:
            warnings.append(f"shape conflict: and {len(facts.conflicts) - 10} more")
        stats = {"values": len(inf.shapes), "fresh_symbols": inf.fresh, "conflicts": len(facts.conflicts),
                 "conflict_list": facts.conflicts[:20],
                 "assumptions": list(facts.assumptions)[:20], "no_rule": dict(inf.no_rule.most_common())}
        return PassResult(model, changed > 0, stats=stats, warnings=warnings)


def _ties(requires: list) -> dict[str, int]:
    """Symbols an op needs equal to a constant, each to one constant only (two: a conflict, no tie)."""
    seen: dict[str, set[int]] = {}
    for lhs, op, rhs, _ in requires:
        if op == "==" and isinstance(lhs, str) and isinstance(rhs, int) and not isinstance(rhs, bool):
            seen.setdefault(lhs, set()).add(rhs)
    return {s: next(iter(v)) for s, v in seen.items() if len(v) == 1}


def model_symbols(model: Model) -> set[str]:
    out: set[str] = set()
    seen: set[int] = set()   # values share their type objects (the importer makes one per type)
    for g in model.all_graphs():
        for v in [*g.inputs, *g.outputs, *g.value_info.values()]:
            t = v.type
            if id(t) in seen or not isinstance(t, TensorType) or not t.shape:
                continue
            seen.add(id(t))
            for d in t.shape:
                out.update(dim_symbols(d))
    return out


class Inference:
    """Shapes (and small integer contents) of one graph's values, computed in node order."""

    def __init__(self, g: Graph, opset: int, taken: set[str], outer: Inference | None = None) -> None:
        self.g, self.opset, self.taken = g, opset, taken
        # a subgraph reads the values of the graphs around it as they are there
        self.shapes: dict[int, Shape | None] = dict(outer.shapes) if outer is not None else {}
        self.values: dict[int, tuple] = dict(outer.values) if outer is not None else {}
        self.facts = Facts()
        self.fresh = 0
        self.no_rule: Counter[str] = Counter()
        # a graph output's contract is what the model returns: where inference proves the declared
        # shape wrong, the inferred one wins (Triton would otherwise reject every response)
        self.outputs = {id(v) for v in g.outputs}
        self.preset: dict[int, Shape | None] = {}   # a body's inputs, as the node around it feeds them
        self.stand_ins: dict[Dim, str] = dict(outer.stand_ins) if outer is not None else {}

    def _loop(self, site: Site) -> list:
        """Loop: the body inferred from the shapes the node feeds it. A loop-carried output has its
        initial value's shape where the body gives it back unchanged (dims that change are left
        unknown); a scan output is [trip count, *its per-iteration shape]."""
        n = site.node
        body = n.attributes["body"].value
        ins, outs = body.inputs, body.outputs
        carried = list(n.inputs[2:])
        if len(ins) != 2 + len(carried) or len(outs) < 1 + len(carried):
            return [None] * len(n.outputs)
        inner = Inference(body, self.opset, self.taken, outer=self)
        inner.preset = {id(ins[0]): (), id(ins[1]): ()}
        for b, v in zip(ins[2:], carried):
            inner.preset[id(b)] = self.shapes.get(id(v)) if v is not None else None
        inner.run()
        self.facts.requires += inner.facts.requires
        result = []
        for i, b in enumerate(ins[2:]):
            before, after = inner.preset.get(id(b)), inner.shapes.get(id(outs[1 + i]))
            if before is None or after is None or len(before) != len(after):
                result.append(None)
            else:
                result.append(tuple(x if x == y else None for x, y in zip(before, after)))
        trip = site.values[0][0] if site.has(0) and site.values[0] and len(site.values[0]) == 1 else None
        trip = trip if isinstance(trip, int) and 0 <= trip < 2**31 else None
        for o in outs[1 + len(carried):]:
            s = inner.shapes.get(id(o))
            result.append(None if s is None else (trip, *s))
        return result

    def symbol(self, base: str) -> str:
        name = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "d"
        candidate, n = name, 1
        while candidate in self.taken:
            n += 1
            candidate = f"{name}_{n}"
        self.taken.add(candidate)
        self.fresh += 1
        return candidate

    def _stated(self, v: Value) -> Shape | None:
        return v.type.shape if isinstance(v.type, TensorType) else None

    def run(self) -> None:
        for v in self.g.inputs:
            if v.const is None:
                self.shapes[id(v)] = (self.preset[id(v)] if self.preset.get(id(v)) is not None
                                      else self.merge(v, None, free=True))
        for v in [*self.g.initializers.values(), *self.g.sparse_initializers.values()]:
            self.shapes[id(v)] = tuple(v.const.dims)
            vals = initial_values(v.type, v.const) if v.name in self.g.initializers else None
            if vals is not None:
                self.values[id(v)] = vals
        for n in self.g.nodes:
            self.node(n)

    def node(self, n: Node) -> None:
        onnx_op = n.is_onnx()
        key = n.op_type if onnx_op else f"{n.domain}.{n.op_type}"
        ins = n._inputs
        shapes, values = self.shapes, self.values
        # (an omitted input, None, is never a key: its shape and contents come back None)
        site = Site(n, [shapes.get(id(v)) for v in ins], [values.get(id(v)) for v in ins], self.opset, self.facts)
        rule = None if n.attributes and any(True for _ in n.subgraphs()) else SHAPE_RULES.get(key)
        if key == "Loop" and "body" in n.attributes:
            rule = self._loop
        outs: list = []
        if rule is None:
            self.no_rule[key] += 1
        else:
            try:
                outs = list(rule(site))
            except _MALFORMED:
                self.no_rule[key] += 1
        for i, v in enumerate(n.outputs):
            ours = outs[i] if i < len(outs) else None
            self.shapes[id(v)] = self.bounded(self.merge(v, ours), n, v)
        vrule = VALUE_RULES.get(key) if onnx_op else None
        if vrule is not None and n.outputs:
            try:
                vals = vrule(site)
            except _MALFORMED:
                vals = None
            if vals is not None and len(vals) <= 64:
                self.values[id(n.outputs[0])] = self.bounded(tuple(A.norm(d) for d in vals), n)

    def bounded(self, dims: Shape | None, n: Node, v: Value | None = None) -> Shape | None:
        """`dims` with every expression past EXPR_LIMIT nodes replaced by its stand-in symbol."""
        if dims is None or all(type(d) is not ShapeExpr or dim_size(d) <= EXPR_LIMIT for d in dims):
            return dims
        stated = self._stated(v) if v is not None else None
        return tuple(self.stand_in(d, n, stated[i] if stated and i < len(stated) else None)
                     if type(d) is ShapeExpr and dim_size(d) > EXPR_LIMIT else d for i, d in enumerate(dims))

    def stand_in(self, d: ShapeExpr, n: Node, stated: Dim = None) -> str:
        sym = self.stand_ins.get(d)
        if sym is None:
            base = "".join(c if c.isalnum() or c == "_" else "_" for c in (n.outputs[0].name if n.outputs else n.op_type))
            # a second run of the pass keeps the stand-in the first one wrote into the value's type
            reuse = isinstance(stated, str) and stated.startswith(f"{base}_expr") and stated not in self.stand_ins.values()
            sym = self.stand_ins[d] = stated if reuse else self.symbol(f"{base}_expr")
            self.facts.assumptions.setdefault(
                f"{sym} stands for an expression of {dim_size(d)} terms over {', '.join(d.symbols())} "
                f"(past the bound of {EXPR_LIMIT}; {n.op_type} {n.name!r})")
        return sym

    def merge(self, v: Value, ours: Shape | None, free: bool = False) -> Shape | None:
        """Our dims, the value's declared ones where ours are unknown, fresh symbols for the rest."""
        stated = self._stated(v)
        if ours is None:
            if stated is None:
                return None
            ours = (None,) * len(stated)
        elif stated is not None and len(stated) != len(ours):
            if id(v) in self.outputs:
                self.facts.conflicts.append(f"{v.name!r}: rank {len(ours)} inferred, {len(stated)} declared; "
                                            "the output contract uses the inferred shape")
                stated = None
            else:
                self.facts.conflicts.append(f"{v.name!r}: rank {len(ours)} inferred, {len(stated)} declared")
                ours = (None,) * len(stated)
        if ours == stated:   # what the model says, confirmed (the usual case: fast path)
            return tuple([A.norm(d) for d in ours]) if None not in ours else self._merge(v, ours, stated)
        return self._merge(v, ours, stated)

    def _merge(self, v: Value, ours: Shape, stated: Shape | None) -> Shape:
        out = []
        for axis, d in enumerate(ours):
            s = stated[axis] if stated is not None else None
            if isinstance(d, int) and isinstance(s, int) and d != s:
                if id(v) in self.outputs:
                    self.facts.conflicts.append(f"{v.name!r} axis {axis}: {d} inferred, {s} declared; "
                                                "the output contract uses the inferred size")
                else:
                    self.facts.conflicts.append(f"{v.name!r} axis {axis}: {d} inferred, {s} declared")
                    d = s
            elif d is None or (isinstance(s, int) and not isinstance(d, int)):
                d = s if not unnamed(s) else self.symbol(f"{v.name}_d{axis}")
            out.append(A.norm(d))
        return tuple(out)

    def write(self) -> int:
        """Store the shapes as the values' types; returns how many types changed."""
        changed = 0
        known = {id(v) for v in [*self.g.inputs, *self.g.outputs]} | set(map(id, self.g.initializers.values()))
        for n in self.g.nodes:
            for v in n.outputs:
                shape = self.shapes.get(id(v))
                if shape is None:
                    continue
                t = v.type if isinstance(v.type, TensorType) else derive_type(v, n)
                if t is None:
                    continue
                new = t if t.shape == shape else _with_shape(t, shape)
                if new is not v.type and new != v.type:
                    v.type = new
                    changed += 1
                if id(v) not in known and v.name:
                    self.g.value_info.setdefault(v.name, v)
        for v in self.g.inputs:
            shape = self.shapes.get(id(v))
            if shape is not None and isinstance(v.type, TensorType) and v.const is None:
                new = _with_shape(v.type, shape)
                changed += new != v.type
                v.type = new
        return changed


def _with_shape(t: TensorType, shape: Shape) -> TensorType:
    den = t.dim_denotations if t.shape is not None and len(t.shape) == len(shape) else None
    return TensorType(t.elem_type, tuple(shape), den, t.denotation, t.sparse)


_BOOL_OUT = {"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor",
             "IsNaN", "IsInf"}
_INT64_OUT = {"Shape", "Size", "NonZero", "ArgMax", "ArgMin"}


def derive_type(v: Value, n: Node) -> TensorType | None:
    """The element type of a node output nothing declared (values new passes made)."""
    if not n.is_onnx():
        elem = None
    elif n.op_type in _BOOL_OUT:
        elem = DataType.BOOL
    elif n.op_type in _INT64_OUT or (n.op_type == "TopK" and v.output_index == 1):
        elem = DataType.INT64
    elif n.op_type == "Cast":
        elem = DataType(n.attributes["to"].value)
    elif n.op_type in ("QuantizeLinear", "DequantizeLinear", "ConstantOfShape", "Where"):
        elem = None
    else:
        first = next((x for x in n.inputs if x is not None), None)
        elem = first.type.elem_type if first is not None and isinstance(first.type, TensorType) else None
    return None if elem is None else TensorType(DataType(elem))


__all__ = ["SymbolicShapesPass", "Inference", "unnamed", "ShapeExpr"]
