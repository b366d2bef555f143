"""Read the printer's text back into a Model, so that a pass test reads as input IR -> expected IR.

    model (opsets ai.onnx:17)
    graph g(%x: float[N, 4])
      weight %lo: float[] = [-1.5]
      weight %hi: float[] = [4.0]
      %a: float[N, 4] = Max(%x, %lo)
      %y: float[N, 4] = Min(%a, %hi)
      return %y

A value's type is taken where the value is made (a graph input, a weight, a node's output);
at a use it may be repeated (the printer does) or left out. Node names are not printed: a node
is named after its first output. Weights need their values (`= [...]`, flat, in C order; one
value fills the tensor) unless `missing_weights="zeros"` (the printer leaves out the values of
weights over 8 elements). `_` is an omitted optional input; `com.microsoft.Op` a node of
another domain; a node's `<graph NAME>` attributes are the indented graphs printed after it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from .dims import BINARY_OPS, Dim, ShapeExpr
from .graph import Attribute, AttrType, Graph, Model, Node, Value
from .tensor import Tensor
from .types import DataType, TensorType


class IRSyntaxError(ValueError):
    """The text is not the printer's format; names the line."""


# a value is % and its name (ONNX names hold "/", "::" and "."; ": " starts the type)
_TOKEN = re.compile(r"""\s*(?:(?P<val>%(?:[^\s,():]|:(?!\s))+)|(?P<str>"(?:[^"\\]|\\.)*")
                         |(?P<num>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf\b|nan\b))
                         |(?P<punct>//|/\^|[%()\[\]{}<>,=:*+\-/?])|(?P<word>[A-Za-z_][\w.]*))""", re.X)


@dataclass
class _Tok:
    kind: str
    text: str


def _lex(line: str, where: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(line):
        if line[pos:].strip() == "":
            break
        m = _TOKEN.match(line, pos)
        if m is None or m.end() == pos:
            raise IRSyntaxError(f"{where}: cannot read {line[pos:].strip()[:20]!r}")
        kind = m.lastgroup
        out.append(_Tok(kind, m.group(kind)))
        pos = m.end()
    return out


class _Line:
    """A cursor over one line's tokens."""

    def __init__(self, text: str, where: str) -> None:
        self.toks, self.i, self.where = _lex(text, where), 0, where

    def peek(self, k: int = 0) -> _Tok | None:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def at(self, text: str) -> bool:
        t = self.peek()
        return t is not None and t.text == text

    def take(self, text: str | None = None, kind: str | None = None) -> _Tok:
        t = self.peek()
        if t is None or (text is not None and t.text != text) or (kind is not None and t.kind != kind):
            want = text or kind
            raise IRSyntaxError(f"{self.where}: expected {want!r}, found {t.text if t else 'end of line'!r}")
        self.i += 1
        return t

    def eat(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    def done(self) -> bool:
        return self.i >= len(self.toks)

    def end(self) -> None:
        if not self.done():
            raise IRSyntaxError(f"{self.where}: unexpected {self.peek().text!r}")


_DTYPES = {d.name.lower(): d for d in DataType}


def _dim(c: _Line) -> Dim:
    t = c.peek()
    if t is None:
        raise IRSyntaxError(f"{c.where}: a shape ends early")
    if t.text == "?":
        c.i += 1
        return None
    if t.text == "(":   # (a op b)
        c.i += 1
        lhs = _dim(c)
        op = c.take().text
        rhs = _dim(c)
        c.take(")")
        name = next((k for k, v in BINARY_OPS.items() if v == op), None)
        if name is None:
            raise IRSyntaxError(f"{c.where}: unknown dim operator {op!r}")
        return ShapeExpr(name, lhs, rhs)
    if t.text in ("max", "min") and c.peek(1) is not None and c.peek(1).text == "(":
        c.i += 2
        lhs = _dim(c)
        c.take(",")
        rhs = _dim(c)
        c.take(")")
        return ShapeExpr(t.text, lhs, rhs)
    c.i += 1
    if t.kind == "num":
        return int(t.text)
    if t.kind == "word":
        return t.text
    if t.kind == "str":
        return json.loads(t.text)
    raise IRSyntaxError(f"{c.where}: {t.text!r} is not a dim")


def _type(c: _Line) -> TensorType:
    name = c.take(kind="word").text
    if name not in _DTYPES:
        raise IRSyntaxError(f"{c.where}: unknown element type {name!r}")
    c.take("[")
    if c.eat("*"):
        c.take("]")
        return TensorType(_DTYPES[name], None)
    dims: list[Dim] = []
    while not c.eat("]"):
        if dims:
            c.take(",")
        dims.append(_dim(c))
    return TensorType(_DTYPES[name], tuple(dims))


def _number(t: _Tok) -> int | float | bool:
    if t.text in ("true", "false"):
        return t.text == "true"
    if t.kind != "num":
        raise ValueError(t.text)
    text = t.text
    return int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)


def _literal_list(c: _Line) -> list:
    c.take("[")
    out: list = []
    while not c.eat("]"):
        if out:
            c.take(",")
        if c.at("."):
            raise IRSyntaxError(f"{c.where}: a list printed in part cannot be read back")
        out.append(_attr_value(c))
    return out


def _attr_value(c: _Line):  # noqa: ANN202
    t = c.peek()
    if t is None:
        raise IRSyntaxError(f"{c.where}: an attribute has no value")
    if t.kind == "str":
        c.i += 1
        return json.loads(t.text)
    if t.text == "[":
        return _literal_list(c)
    if t.text == "<":
        c.i += 1
        c.take("graph")
        name = _Parser.graph_name(c)
        c.take(">")
        return ("graph", name)
    if t.text == "tensor" and c.peek(1) is not None and c.peek(1).text == "(":
        c.i += 2
        ty = _type(c)
        values = None
        if c.eat(","):
            values = _literal_list(c)
        c.take(")")
        return ("tensor", ty, values)
    if t.kind in ("num", "word"):
        c.i += 1
        try:
            return _number(t)
        except ValueError:
            raise IRSyntaxError(f"{c.where}: {t.text!r} is not an attribute value") from None
    raise IRSyntaxError(f"{c.where}: {t.text!r} is not an attribute value")


def _tensor(name: str, ty: TensorType, values: list | None, missing: str, where: str) -> Tensor:
    dims = [int(d) if isinstance(d, int) else -1 for d in (ty.shape or ())]
    if any(d < 0 for d in dims):
        raise IRSyntaxError(f"{where}: weight {name} needs a static shape")
    dtype = DataType(ty.elem_type)
    if values is None:
        if missing != "zeros":
            raise IRSyntaxError(f"{where}: weight {name} has no values (write `= [...]`)")
        values = [0]
    a = np.array(values, dtype=dtype.numpy_dtype).reshape(-1)
    size = int(np.prod(dims, dtype=np.int64))
    if a.size == 1 and size != 1:
        a = np.full(size, a[0], dtype=a.dtype)
    if a.size != size:
        raise IRSyntaxError(f"{where}: weight {name} has {a.size} values for shape {dims}")
    return Tensor.from_numpy(name, a.reshape(dims), dtype)


def _attribute(name: str, v, graphs: dict[str, Graph], where: str, missing: str) -> Attribute:  # noqa: ANN001
    if isinstance(v, tuple) and v[0] == "graph":
        if v[1] not in graphs:
            raise IRSyntaxError(f"{where}: no graph {v[1]} follows the node")
        return Attribute(name, AttrType.GRAPH, graphs[v[1]])
    if isinstance(v, tuple) and v[0] == "tensor":
        return Attribute(name, AttrType.TENSOR, _tensor(name, v[1], v[2], missing, where))
    if isinstance(v, bool):
        return Attribute(name, AttrType.INT, int(v))
    if isinstance(v, int):
        return Attribute(name, AttrType.INT, v)
    if isinstance(v, float):
        return Attribute(name, AttrType.FLOAT, v)
    if isinstance(v, str):
        return Attribute(name, AttrType.STRING, v.encode())
    if isinstance(v, list):
        if all(isinstance(x, str) for x in v) and v:
            return Attribute(name, AttrType.STRINGS, [x.encode() for x in v])
        if any(isinstance(x, float) for x in v):
            return Attribute(name, AttrType.FLOATS, [float(x) for x in v])
        return Attribute(name, AttrType.INTS, [int(x) for x in v])
    raise IRSyntaxError(f"{where}: attribute {name} has a value of no known kind")


class _Parser:
    def __init__(self, text: str, missing: str) -> None:
        self.lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines())
                      if ln.strip() and not ln.lstrip().startswith("//")]
        self.pos = 0
        self.missing = missing

    def where(self) -> str:
        return f"line {self.lines[self.pos][0]}" if self.pos < len(self.lines) else "end of text"

    def model(self) -> Model:
        if not self.lines:
            raise IRSyntaxError("no IR: the text is empty")
        c = _Line(self.lines[0][1], self.where())
        c.take("model")
        opsets: dict[str, int] = {}
        if c.eat("("):
            c.take("opsets")
            while not c.eat(")"):
                if opsets:
                    c.take(",")
                dom = c.take(kind="word").text
                c.take(":")
                opsets["" if dom == "ai.onnx" else dom] = int(c.take(kind="num").text)
        c.end()
        self.pos = 1
        g = self.graph(indent=0, scope=[])
        if self.pos != len(self.lines):
            raise IRSyntaxError(f"{self.where()}: text after the main graph's return")
        return Model(g, opsets or {"": 17})

    def graph(self, indent: int, scope: list[dict[str, Value]]) -> Graph:
        where = self.where()
        line = self.lines[self.pos][1]
        if len(line) - len(line.lstrip()) != indent:
            raise IRSyntaxError(f"{where}: expected a graph at indent {indent}")
        c = _Line(line, where)
        c.take("graph")
        g = Graph()
        g.name = self.graph_name(c)
        values: dict[str, Value] = {}
        c.take("(")
        while not c.eat(")"):
            if g.inputs:
                c.take(",")
            v = self.define(c, values)
            g.inputs.append(v)
        c.end()
        self.pos += 1
        body = indent + 2
        while self.pos < len(self.lines):
            where = self.where()
            line = self.lines[self.pos][1]
            if len(line) - len(line.lstrip()) != body:
                raise IRSyntaxError(f"{where}: expected a node, weights or return at indent {body}")
            c = _Line(line, where)
            if c.eat("weight"):
                v = self.define(c, values, inputs=g.inputs)
                shown = _literal_list(c) if c.eat("=") else None
                c.end()
                v.const = _tensor(v.name, v.type, shown, self.missing, where)
                g.initializers[v.name] = v
                self.pos += 1
            elif c.eat("return"):
                while not c.done():
                    if g.outputs:
                        c.take(",")
                    g.outputs.append(self.use(c, [*scope, values]))
                self.pos += 1
                return g
            else:
                self.node(c, g, values, scope, body)
        raise IRSyntaxError(f"graph {g.name or '(main)'} has no return")

    @staticmethod
    def graph_name(c: _Line) -> str:
        """NAME, "a quoted name", or (main) for the unnamed main graph."""
        if c.at("(") and c.peek(1) is not None and c.peek(1).text == "main":
            c.take("(")
            c.take("main")
            c.take(")")
            return ""
        t = c.take()
        if t.kind == "str":
            return json.loads(t.text)
        if t.kind != "word":
            raise IRSyntaxError(f"{c.where}: {t.text!r} is not a graph name")
        return t.text

    def define(self, c: _Line, values: dict[str, Value], inputs: list[Value] = ()) -> Value:
        """A new value; a weight may also be a graph input (older ONNX lists initializers so)."""
        name = c.take(kind="val").text[1:]
        ty = _type(c) if c.eat(":") else None
        if name in values:
            if any(v is values[name] for v in inputs):
                return values[name]
            raise IRSyntaxError(f"{c.where}: %{name} is defined twice")
        v = Value(name, ty)
        values[name] = v
        return v

    def use(self, c: _Line, scopes: list[dict[str, Value]]) -> Value | None:
        if c.eat("_"):
            return None
        name = c.take(kind="val").text[1:]
        if c.eat(":"):
            _type(c)   # repeated at the use: the definition's counts
        for values in reversed(scopes):
            if name in values:
                return values[name]
        raise IRSyntaxError(f"{c.where}: %{name} is used before it is defined")

    def node(self, c: _Line, g: Graph, values: dict[str, Value], scope: list[dict[str, Value]], indent: int) -> None:
        outs: list[Value] = []
        while not c.at("="):
            if outs:
                c.take(",")
            outs.append(self.define(c, values))
        c.take("=")
        op = c.take(kind="word").text
        domain, _, op_type = op.rpartition(".")
        c.take("(")
        ins: list[Value | None] = []
        while not c.eat(")"):
            if ins:
                c.take(",")
            ins.append(self.use(c, [*scope, values]))
        raw: list[tuple[str, object]] = []
        if c.eat("{"):
            while not c.eat("}"):
                if raw:
                    c.take(",")
                key = c.take(kind="word").text
                c.take("=")
                raw.append((key, _attr_value(c)))
        c.end()
        where = c.where
        self.pos += 1
        graphs: dict[str, Graph] = {}
        for _, v in raw:
            for ref in (v if isinstance(v, list) else [v]):
                if isinstance(ref, tuple) and ref[0] == "graph":
                    sub = self.graph(indent + 2, [*scope, values])
                    graphs[sub.name] = sub
        attrs = [_attribute(k, v, graphs, where, self.missing) for k, v in raw]
        g.nodes.append(Node(op_type, ins, outs, domain=domain, name=outs[0].name if outs else op_type,
                            attributes=attrs))


def parse_model(text: str, missing_weights: str = "error") -> Model:
    """The Model the printer's `text` describes (`missing_weights="zeros"`: weights printed
    without values hold zeros)."""
    return _Parser(text, missing_weights).model()
