"""The deduplicate-weights pass: structure after, and onnxruntime outputs equal to the original's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _exact_cases import F, X, _load, _run, _same_outputs
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.passes.normalize import (
    DeduplicateWeightsPass,
)


def test_deduplicate_weights(tmp_path):
    w = numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w1")
    w2 = numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w2")
    w3 = numpy_helper.from_array(np.full((3, 2), 0.5, np.float32), "w3")  # same bytes, other dims
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "w1"], ["a"]), helper.make_node("Mul", ["a", "w2"], ["b"]),
         helper.make_node("Transpose", ["w3"], ["w3t"]), helper.make_node("Sub", ["b", "w3t"], ["y"])],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])],
        [w, w2, w3])
    orig, model = _load(tmp_path, g)
    r = _run(DeduplicateWeightsPass(), model)
    assert r.stats == {"initializers_merged": 1, "bytes_saved": 24}
    assert sorted(model.graph.initializers) == ["w1", "w3"]
    _same_outputs(orig, model, {"x": X})


@pytest.mark.parametrize("external", [False, True])
def test_deduplicate_large_weights_by_fingerprint_then_bytes(tmp_path, external):
    from mcp_compiler.passes.normalize.dedup_weights import _fingerprint

    # 64 KiB tensors: the sampled fingerprint decides first; "mid" differs from "a" only between
    # the sampled pieces, so only the whole-bytes comparison tells them apart. With external
    # data the bytes are read from the file (pread), not through the mapping.
    base = np.arange(16384, dtype=np.float32)
    mid = base.copy()
    mid[1500] = -1.0  # byte 6000: between the first two sampled pieces
    inits = [numpy_helper.from_array(base, "a"), numpy_helper.from_array(base.copy(), "b"),
             numpy_helper.from_array(mid, "mid")]
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "a"], ["s1"]), helper.make_node("Add", ["s1", "b"], ["s2"]),
         helper.make_node("Add", ["s2", "mid"], ["y"])],
        "g", [helper.make_tensor_value_info("x", F, [16384])], [helper.make_tensor_value_info("y", F, [16384])],
        inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "m.onnx"
    if external:
        onnx.save(m, p, save_as_external_data=True, location="w.bin", size_threshold=0)
    else:
        onnx.save(m, p)
    model = load_onnx(p).model
    consts = {n: model.graph.initializers[n].const for n in ("a", "b", "mid")}
    assert all((t.source is not None) == external for t in consts.values())
    assert _fingerprint(consts["a"]) == _fingerprint(consts["mid"])  # the bytes decide, not the samples
    r = _run(DeduplicateWeightsPass(), model)
    assert r.stats == {"initializers_merged": 1, "bytes_saved": 65536}
    assert sorted(model.graph.initializers) == ["a", "mid"]
    _same_outputs(p, model, {"x": np.ones(16384, np.float32)})


def test_small_weights_merge_by_their_bytes(tmp_path):
    """Small tensors are keyed by their bytes: -0.0 and 0.0 differ (their bytes do), equal NaNs
    merge, the first of equal ones is kept."""
    vals = {"z": [0.0, 1.0], "nz": [-0.0, 1.0], "z2": [0.0, 1.0], "n1": [np.nan, 1.0], "n2": [np.nan, 1.0]}
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in vals.items()]
    nodes, prev = [], "x"
    for i, k in enumerate(vals):
        nodes.append(helper.make_node("Add", [prev, k], [f"s{i}"]))
        prev = f"s{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2])],
                          [helper.make_tensor_value_info(prev, F, [2])], inits)
    orig, model = _load(tmp_path, g)
    r = _run(DeduplicateWeightsPass(), model)
    assert r.stats == {"initializers_merged": 2, "bytes_saved": 16}
    assert list(model.graph.initializers) == ["z", "nz", "n1"]
    assert [n.inputs[1].name for n in model.graph.nodes] == ["z", "nz", "z", "n1", "n1"]
