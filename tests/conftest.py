"""Shared fixtures."""

from __future__ import annotations

import numpy as np
import onnx
import pytest


@pytest.fixture
def tiny_model() -> onnx.ModelProto:
    """y = relu(x @ W + b), x: [N, 4]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(autouse=True)
def verify_each_pass():
    """Every pipeline run in-process checks the IR and each pass's claims after every pass
    (the VerifyEach instrument, what --verify-each attaches), so a pass that breaks what it says
    it establishes or preserves fails the test using it."""
    from mcp_compiler.passes._infra import PassManager, VerifyEach

    inst = VerifyEach()
    PassManager.global_instruments.append(inst)
    yield inst
    PassManager.global_instruments.remove(inst)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="Rewrite the golden IR dumps (golden_models/*/ir/) from what the compiler prints now.")


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")
