"""Helpers of the fusion tests: outputs equal within the float32 rounding each pass states."""

from __future__ import annotations

import numpy as np
import onnx
from _helpers import ort_run
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.normalize import (
    DeadCodeEliminationPass,
)

RTOL, ATOL = 1e-4, 1e-5   # folded weights are rounded to float32 once
rng = np.random.default_rng(0)


def _init(name, *shape, positive=False):
    a = rng.standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(np.abs(a) + 0.5 if positive else a, name)


def _save(tmp_path, nodes, inputs, outputs, inits, opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    return m


def _run(p, m, tmp_path, feeds, rtol=RTOL, atol=ATOL):
    model = load_onnx(tmp_path / "m.onnx").model
    r = p.run(model, PassContext())
    assert not p.broken_claims(model, PassContext()), p.broken_claims(model, PassContext())   # --verify-each
    DeadCodeEliminationPass().run(model, PassContext())
    verify(model)
    for a, b in zip(ort_run(m, feeds), ort_run(to_onnx(model), feeds)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)
    return model, r


def _ops(model):
    return [n.op_type for n in model.graph.nodes]


def _bn(name, x, y, c):
    return (helper.make_node("BatchNormalization", [x, f"{name}_g", f"{name}_b", f"{name}_m", f"{name}_v"], [y],
                             epsilon=1e-3),
            [_init(f"{name}_g", c), _init(f"{name}_b", c), _init(f"{name}_m", c), _init(f"{name}_v", c, positive=True)])

def _layernorm_nodes(opset, square="Pow", affine=True):
    axes = {"axes": [-1]} if opset < 18 else {}
    ax_in = [] if opset < 18 else ["ax"]
    nodes = [helper.make_node("ReduceMean", ["x", *ax_in], ["m"], **axes),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]) if square == "Pow" else helper.make_node("Mul", ["d", "d"], ["p"]),
             helper.make_node("ReduceMean", ["p", *ax_in], ["v"], **axes),
             helper.make_node("Add", ["v", "eps"], ["e"]),
             helper.make_node("Sqrt", ["e"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n" if affine else "y"])]
    if affine:
        nodes += [helper.make_node("Mul", ["n", "gamma"], ["ng"]), helper.make_node("Add", ["ng", "beta"], ["y"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"), _init("gamma", 16), _init("beta", 16),
             numpy_helper.from_array(np.array([-1], np.int64), "ax")]
    return nodes, inits
