"""The simplify-casts pass: Cast chains through a type that holds every value are one Cast."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _exact_cases import _ops, _run, _same_outputs
from _helpers import save_model
from onnx import TensorProto as TP
from onnx import helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.normalize import IdentityEliminationPass, SimplifyCastsPass


@pytest.mark.parametrize("src, mid, dst, ops", [
    (TP.FLOAT16, TP.FLOAT, TP.DOUBLE, ["Cast"]),      # widening twice: one Cast
    (TP.FLOAT, TP.DOUBLE, TP.FLOAT, []),              # a round trip: no Cast at all
    (TP.INT8, TP.INT32, TP.FLOAT, ["Cast"]),
    (TP.FLOAT, TP.FLOAT16, TP.FLOAT, ["Cast", "Cast"]),   # float16 rounds: both stay
    (TP.INT64, TP.INT32, TP.INT64, ["Cast", "Cast"]),     # int32 wraps: both stay
])
def test_cast_chains(tmp_path, src, mid, dst, ops):
    nodes = [helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Cast", ["n"], ["m"], to=mid), helper.make_node("Cast", ["m"], ["y"], to=dst)]
    path = save_model(tmp_path, "m", nodes, [helper.make_tensor_value_info("x", src, [3, 5])],
                      [helper.make_tensor_value_info("y", dst, [3, 5])])
    original, model = onnx.load(path), load_onnx(path).model
    r = _run(SimplifyCastsPass(), model)
    assert r.modified == (len(ops) < 2)
    IdentityEliminationPass().run(model, PassContext())
    assert _ops(model) == ["Neg", *ops]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(src)
    x = np.clip(np.random.default_rng(0).standard_normal((3, 5)) * 1e5, -6e4, 6e4).astype(dtype)   # within float16
    _same_outputs(original, model, {"x": x})
