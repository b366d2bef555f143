"""Property tests: the serializer round-trips random graphs; the reader survives mutated bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_compiler.errors import InvalidModelError
from mcp_compiler.ir import DataType, Graph, Model, Node, ShapeExpr, Tensor, TensorType, Value
from mcp_compiler.lower import to_onnx
from mcp_compiler.mcpir import from_buffer, to_bytes

dims = st.one_of(st.integers(0, 64), st.sampled_from(["N", "H", "W", "seq"]), st.none())
exprs = st.builds(ShapeExpr, st.sampled_from(["add", "mul", "floor_div", "ceil_div", "max"]),
                  st.sampled_from(["N", "H"]), st.integers(1, 32))
dtypes = st.sampled_from([DataType.FLOAT, DataType.FLOAT16, DataType.BFLOAT16, DataType.INT4,
                          DataType.UINT4, DataType.FLOAT8E4M3FN, DataType.FLOAT8E5M2, DataType.INT64,
                          DataType.BOOL, DataType.DOUBLE, DataType.UINT8])


@st.composite
def models(draw):
    g = Graph("g")
    shape = tuple(draw(st.lists(st.one_of(dims, exprs), max_size=4)))
    x = Value("x", TensorType(DataType.FLOAT, shape))
    g.inputs.append(x)
    prev = x
    for i in range(draw(st.integers(1, 6))):
        dt = draw(dtypes)
        n = draw(st.integers(0, 17))
        raw = bytes(draw(st.binary(min_size=dt.nbytes(n), max_size=dt.nbytes(n))))
        w = Value(f"w{i}", const=Tensor(f"w{i}", dt, [n], raw))
        g.initializers[w.name] = w
        out = Value(f"v{i}", TensorType(DataType.FLOAT, shape))
        g.nodes.append(Node(draw(st.sampled_from(["Add", "Mul", "Custom"])), [prev, w], [out],
                            domain=draw(st.sampled_from(["", "x.y"]))))
        prev = out
    g.outputs.append(prev)
    return Model(g, {"": 17, "x.y": 1})


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models())
def test_roundtrip_random_graphs(model):
    back = from_buffer(to_bytes(model))
    assert to_onnx(back).SerializeToString() == to_onnx(model).SerializeToString()
    assert back.graph.inputs[0].type == model.graph.inputs[0].type
    for name, v in model.graph.initializers.items():
        assert back.graph.initializers[name].const.raw.tobytes() == v.const.raw.tobytes()


_BASE = to_bytes(Model(Graph("g"), {"": 17}))


def _seed_file() -> bytes:
    g = Graph("g")
    x = Value("x", TensorType(DataType.FLOAT, ("N", 3)))
    w = Value("w", const=Tensor.from_numpy("w", np.arange(6, dtype=np.float32).reshape(2, 3)))
    y = Value("y", TensorType(DataType.FLOAT, ("N", 3)))
    g.inputs.append(x)
    g.initializers["w"] = w
    g.nodes.append(Node("Add", [x, w], [y], name="add"))
    g.outputs.append(y)
    return to_bytes(Model(g, {"": 17}))


SEED = _seed_file()


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SEED) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(12, len(SEED)))
def test_reader_never_crashes_on_mutated_bytes(mutations, cut):
    data = bytearray(SEED[:cut])
    for pos, val in mutations:
        if pos < len(data) and not 8 <= pos < 12:  # keep the identifier: reach the deep checks
            data[pos] = val
    try:
        from_buffer(bytes(data))
    except InvalidModelError:
        pass  # the only acceptable failure
