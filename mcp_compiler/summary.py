"""What `inspect` shows: a model's interface, op histogram, weights and contracts."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from .ir.dims import dim_symbols
from .ir.graph import Layout, Model, Value
from .ir.types import DataType, TensorType


@dataclass
class ValueSummary:
    name: str
    type: str
    layout: str
    dtype: str | None = None
    shape: list | None = None   # ints, symbol names, expressions as text, None = unknown
    served_shape: list | None = None   # where a Triton entry takes it otherwise: a scalar travels as [1]


@dataclass
class ModelSummary:
    format: str
    ir_version: int
    producer: str
    opsets: dict[str, int]
    inputs: list[ValueSummary]
    outputs: list[ValueSummary]
    nodes: int
    op_histogram: dict[str, int]
    weights: int
    weight_bytes: int
    weight_bytes_by_dtype: dict[str, int]
    symbols: list[str]
    functions: list[str] = field(default_factory=list)
    subgraphs: int = 0
    # symbolic shape inference (inspect runs it): what it had to assume and what contradicts
    shape_assumptions: list[str] = field(default_factory=list)
    shape_conflicts: list[str] = field(default_factory=list)
    no_shape_rule: dict[str, int] = field(default_factory=dict)
    # per input symbol: the size checks use (verify, deploy's smoke test, warm-up) and what the
    # model's ops require of it; "error" when no size satisfies them
    input_sizes: dict = field(default_factory=dict)
    values: list[ValueSummary] | None = None   # every value's shape (inspect --values)
    # inputs the model reads its state from and the outputs it gives the next state in (state.py)
    state_pairs: list[dict] = field(default_factory=list)
    # pairs by shape alone (state.proposed_pairs): never used, `--state IN=OUT` serves one
    state_proposed: list[dict] = field(default_factory=list)
    # a decoder LLM (llm/spec.py): layers, KV heads, head size, context, the cache's bytes a token
    llm: dict | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("inputs", "outputs", "values"):
            for v in d.get(key) or ():
                if v.get("served_shape") is None:   # only a scalar is served otherwise
                    v.pop("served_shape", None)
        return d


def _value(v: Value) -> ValueSummary:
    t = v.type
    s = ValueSummary(v.name, "unknown" if t is None else str(t), Layout(v.layout).name)
    if isinstance(t, TensorType):
        s.dtype = DataType(t.elem_type).name.lower()
        if t.shape is not None:
            s.shape = [d if (d is None or isinstance(d, (int, str))) else str(d) for d in t.shape]
            if not t.shape:
                s.served_shape = [1]
    return s


def summarize(model: Model, fmt: str, values: bool = False) -> ModelSummary:
    hist: Counter[str] = Counter()
    nodes = 0
    for n in model.graph.walk():
        nodes += 1
        hist[f"{n.domain}.{n.op_type}" if not n.is_onnx() else n.op_type] += 1
    by_dtype: Counter[str] = Counter()
    count = 0
    for t in model.tensors():
        count += 1
        by_dtype[t.dtype.name.lower()] += t.nbytes
    symbols: dict[str, None] = {}   # the symbols of the model's interface, in order
    for v in [*model.graph.inputs, *model.graph.outputs]:
        if isinstance(v.type, TensorType) and v.type.shape:
            for d in v.type.shape:
                for s in dim_symbols(d):
                    symbols.setdefault(s)
    subgraphs = sum(1 for _ in model.graph.graphs()) - 1
    return ModelSummary(
        format=fmt, ir_version=model.ir_version,
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        opsets=dict(sorted(model.opset_imports.items())),
        inputs=[_value(v) for v in model.graph.inputs if v.const is None],
        outputs=[_value(v) for v in model.graph.outputs],
        nodes=nodes, op_histogram=dict(hist.most_common()), weights=count,
        weight_bytes=sum(by_dtype.values()), weight_bytes_by_dtype=dict(by_dtype.most_common()),
        symbols=list(symbols), functions=[f"{f.domain}.{f.name}" for f in model.functions],
        subgraphs=subgraphs,
        values=[_value(o) for n in model.graph.nodes for o in n.outputs if o.name] if values else None)
