"""Property tests for the fusions: random chains of exported blocks (clamps, hard-swish,
GELU, layer norm) through the whole default pipeline equal onnxruntime on the original."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from _helpers import ort_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.options import PipelineOptions
from mcp_compiler.pipeline import build

C = 8   # the last dim: layer norm's channels


class _Builder:
    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def const(self, v, shape=()) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.full(shape, v, np.float32), name))
        return name

    def mean(self, x: str) -> str:
        """ReduceMean over the last axis: axes an attribute below opset 18, an input since."""
        if self.opset < 18:
            return self.op("ReduceMean", x, axes=[-1])
        self.n += 1
        axes = f"axes{self.n}"
        self.inits.append(numpy_helper.from_array(np.array([-1], np.int64), axes))
        return self.op("ReduceMean", x, axes)

    def op(self, op: str, *ins: str, **attrs) -> str:
        self.n += 1
        out = f"v{self.n}"
        self.nodes.append(helper.make_node(op, list(ins), [out], **attrs))
        return out


def _clamps(b: _Builder, x: str, draw) -> str:
    """One to three of Relu, Min/Max by a constant, Clip, one after the other."""
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["Relu", "Min", "Max", "Clip"]))
        lo, hi = sorted(draw(st.lists(st.sampled_from([-3.0, -1.0, 0.0, 0.5, 2.0, 6.0]), min_size=2, max_size=2)))
        if kind == "Relu":
            x = b.op("Relu", x)
        elif kind == "Clip":
            x = b.op("Clip", x, b.const(lo), b.const(hi))
        else:
            k = b.const(lo if kind == "Max" else hi)
            x = b.op(kind, *((x, k) if draw(st.booleans()) else (k, x)))
    return x


def _hardswish(b: _Builder, x: str, draw) -> str:
    k = b.op("Clip", b.op("Add", x, b.const(3.0)), b.const(0.0), b.const(6.0))
    if draw(st.booleans()):
        return b.op("Div", b.op("Mul", x, k), b.const(6.0))
    return b.op("Mul", x, b.op("Div", k, b.const(6.0)))


def _gelu(b: _Builder, x: str, draw) -> str:
    if draw(st.booleans()):
        t = b.op("Add", b.op("Erf", b.op("Div", x, b.const(math.sqrt(2)))), b.const(1.0))
    else:
        cube = b.op("Pow", x, b.const(3.0))
        inner = b.op("Mul", b.const(math.sqrt(2 / math.pi)), b.op("Add", x, b.op("Mul", b.const(0.044715), cube)))
        t = b.op("Add", b.const(1.0), b.op("Tanh", inner))
    return b.op("Mul", b.op("Mul", x, t), b.const(0.5))


def _layernorm(b: _Builder, x: str, draw) -> str:
    d = b.op("Sub", x, b.mean(x))
    var = b.mean(b.op("Mul", d, d) if draw(st.booleans()) else b.op("Pow", d, b.const(2.0)))
    n = b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const(1e-5))))
    if draw(st.booleans()):
        n = b.op("Add", b.op("Mul", n, b.const(1.5, (C,))), b.const(0.25, (C,)))
    return n


BLOCKS = [_clamps, _hardswish, _gelu, _layernorm]


@st.composite
def chains(draw):
    opset = draw(st.sampled_from([13, 17, 20]))
    b = _Builder(opset)
    x = "x"
    for block in draw(st.lists(st.sampled_from(BLOCKS), min_size=1, max_size=6)):
        x = block(b, x, draw)
        if draw(st.integers(0, 4)) == 0:   # a value used twice: no fusion may swallow it
            x = b.op("Add", x, b.op("Mul", x, b.const(0.5)))
    g = helper.make_graph(b.nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3, C])],
                          [helper.make_tensor_value_info(x, TP.FLOAT, ["N", 3, C])], b.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(chains())
def test_default_pipeline_keeps_the_outputs_of_random_chains(tmp_path, m):
    onnx.save(m, tmp_path / "m.onnx")
    model = load_onnx(tmp_path / "m.onnx").model
    build(options=PipelineOptions(verify_each=True)).run(model)
    verify(model)
    x = np.random.default_rng(0).uniform(-6, 6, (2, 3, C)).astype(np.float32)
    np.testing.assert_allclose(ort_run(to_onnx(model), {"x": x})[0], ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert len(model.graph.nodes) <= len(m.graph.node)
