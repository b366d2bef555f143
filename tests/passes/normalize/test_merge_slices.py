"""The merge-slices pass: consecutive Slices over different axes are one Slice."""

from __future__ import annotations

import numpy as np
import pytest
from _exact_cases import F, _load, _ops, _run
from _helpers import ort_run
from onnx import helper, numpy_helper

from mcp_compiler.lower import to_onnx
from mcp_compiler.passes.normalize import MergeSlicesPass


def _slice(name, x, y, starts, ends, axes, steps=None):
    ps = [(f"{name}_s", starts), (f"{name}_e", ends), (f"{name}_a", axes)] + ([(f"{name}_p", steps)] if steps else [])
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ps]
    return helper.make_node("Slice", [x, *(k for k, _ in ps)], [y]), inits


@pytest.mark.parametrize("first, second, merged", [
    (([0], [129], [1]), ([1], [2**63 - 1], [2]), True),        # PyTorch's STFT: x[:, :129, 1:]
    (([1], [7], [0], [2]), ([-3], [2**63 - 1], [-1], [-1]), True),   # steps and negative axes
    (([0], [5], [1]), ([1], [3], [1]), False),                 # the same axis twice
])
def test_merge_slices(tmp_path, first, second, merged):
    a, ia = _slice("a", "n", "m", *first)
    b, ib = _slice("b", "m", "o", *second)
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["n"]), a, b, helper.make_node("Relu", ["o"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", F, [8, 6, 5])], [helper.make_tensor_value_info("y", F, ["d0", "d1", "d2"])],
                          [*ia, *ib])
    original, model = _load(tmp_path, g)
    r = _run(MergeSlicesPass(), model)
    assert r.modified == merged
    assert _ops(model) == ["Neg", "Slice", "Relu"] if merged else ["Neg", "Slice", "Slice", "Relu"]
    x = np.random.default_rng(0).standard_normal((8, 6, 5)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(to_onnx(model), {"x": x})[0], ort_run(original, {"x": x})[0])
