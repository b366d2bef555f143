"""A model over 2 GB end to end: ONNX with external data -> passes -> .mcpir -> Triton repository
with both backends -> verify against onnxruntime. The weights are a sparse file (mostly holes,
a few distinct bytes per tensor), so the test costs disk writes, not a download or RAM."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mcp_compiler import CompileOptions, compile_model
from mcp_compiler.mcpir import read_mcpir

pytestmark = pytest.mark.slow  # a model over 2 GB

K, N, COUNT = 16384, 12000, 3  # 3 x 786 MB of FP32 weights: 2.36 GB


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("over2gb")
    size = K * N * 4
    data = d / "weights.bin"
    with open(data, "wb") as f:
        f.truncate(size * COUNT)
        for i in range(COUNT):  # a few non-zero weights per tensor, different in each
            for row in (0, K // 2, K - 1):
                f.seek(i * size + row * N * 4 + 4 * (i + 1))
                f.write(np.float32(0.5 + i).tobytes())
    inits, nodes = [], []
    for i in range(COUNT):
        t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[K, N])
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "weights.bin"), ("offset", str(i * size)), ("length", str(size))):
            t.external_data.add(key=k, value=v)
        inits.append(t)
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]))
    nodes += [helper.make_node("Add", ["y0", "y1"], ["s"]), helper.make_node("Add", ["s", "y2"], ["y"])]
    g = helper.make_graph(nodes, "over2gb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", K])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", N])], inits)
    src = d / "model.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    return src


@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
def test_over_2gb_converts_and_verifies(big, tmp_path, backend):
    repo = tmp_path / "repo"
    rep = compile_model(big, repo, CompileOptions.for_target("triton-v1.12", "big", backend=backend,
                                                             verify=True, dims={"N": 2}))
    assert rep.weight_bytes == COUNT * K * N * 4 > 2**31
    assert rep.verification["ok"]
    vdir = repo / "big" / "1"
    if backend == "python":
        model = read_mcpir(vdir / "model.mcpir")
        assert (vdir / "model.mcpir").stat().st_size > 2**31
        ends = [v.const.source[1] + v.const.nbytes for v in model.graph.initializers.values()]
        assert max(ends) > 2**31  # a record past the 2 GiB mark: no 32-bit offset anywhere
    else:
        assert (vdir / "model.onnx.data").stat().st_size > 2**31
        assert (vdir / "model.onnx").stat().st_size < 1 << 20  # weights outside the protobuf
    os.sync()
