"""Helpers of the exact normalization passes' tests: outputs stay bit-identical."""

from __future__ import annotations

import numpy as np
import onnx
from _helpers import ort_run
from onnx import TensorProto, helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir.verify import verify
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext

F = TensorProto.FLOAT

RTOL, ATOL = 0.0, 0.0  # these passes move no arithmetic: outputs stay bit-identical


def _load(tmp_path, graph, opset=17, ir_version=8):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    return m, load_onnx(p).model


def _run(p, model):
    result = p.run(model, PassContext(verify_each=True))
    verify(result.model)
    assert not p.broken_claims(model, PassContext()), p.broken_claims(model, PassContext())   # --verify-each
    return result


def _same_outputs(original, model, feeds, rtol=None, atol=None):
    for a, b in zip(ort_run(original, feeds), ort_run(to_onnx(model), feeds)):
        np.testing.assert_allclose(b, a, rtol=RTOL if rtol is None else rtol, atol=ATOL if atol is None else atol)


def _ops(model):
    return [n.op_type for n in model.graph.nodes]


X = np.arange(6, dtype=np.float32).reshape(2, 3)
