"""The serving runtime a repository carries: self-contained, equal to onnxruntime on the original."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from _helpers import ZOO_INPUTS, golden_dirs, light_models, ort_run, random_feeds, zoo_models

from mcp_compiler.frontend import load_onnx
from mcp_compiler.lower import to_onnx
from mcp_compiler.mcpir import write_mcpir
from mcp_compiler.targets.triton.emit import write_runtime
from mcp_compiler.targets.triton.verify import load_runtime


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    d = tmp_path_factory.mktemp("runtime")
    write_runtime(d)
    return load_runtime(d)


def _normalized(m: onnx.ModelProto) -> bytes:
    """Serialized with fields at their default value cleared (proto2 presence aside)."""
    def walk(msg):
        for fd, val in msg.ListFields():
            if fd.type == fd.TYPE_MESSAGE:
                for sub in (val if fd.is_repeated else [val]):
                    walk(sub)
            elif not fd.is_repeated and val == fd.default_value:
                msg.ClearField(fd.name)
    m = onnx.ModelProto.FromString(m.SerializeToString())
    walk(m)
    return m.SerializeToString(deterministic=True)


def _cases():
    for d in golden_dirs():
        yield pytest.param(d / "model.onnx", dict(np.load(d / "inputs.npz")), id=f"golden-{d.name}")
    for p in zoo_models():
        x = np.random.default_rng(0).random(ZOO_INPUTS[p.name], dtype=np.float32)
        yield pytest.param(p, {"x": x}, id=p.stem)
    for p in light_models()[:3]:
        yield pytest.param(p, None, id=p.stem)


@pytest.mark.parametrize("src, feeds", list(_cases()))
def test_runtime_matches_original(runtime, src, feeds, tmp_path):
    model = load_onnx(src).model
    write_mcpir(model, tmp_path / "m.mcpir")
    feeds = feeds if feeds is not None else random_feeds(onnx.load(src), {"N": 1})
    rt = runtime.MCPIRModel(tmp_path / "m.mcpir", keep_proto=True)
    for a, b in zip(ort_run(src, feeds), rt.run(feeds)):
        np.testing.assert_array_equal(a, b)  # no pass ran: bit-exact
    for a, b in zip(ort_run(src, feeds), runtime.MCPIRModel(tmp_path / "m.mcpir", prepack=False).run(feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)  # other kernels: not bitwise
    # The hand-encoded protobuf says what the compiler's own lowering for onnxruntime says
    # (weights aside; the main graph's inner shapes left to onnxruntime's inference).
    lowered = onnx.ModelProto.FromString(rt.onnx_bytes)
    reference = to_onnx(model, value_info=False)
    assert not lowered.graph.value_info
    for t in lowered.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            ref = next(r for r in reference.graph.initializer if r.name == t.name)
            ref.ClearField("raw_data")
            ref.data_location = onnx.TensorProto.EXTERNAL
            ref.external_data.extend(t.external_data)
    assert _normalized(lowered) == _normalized(reference)


def test_weights_are_not_copied_into_the_protobuf(runtime, tmp_path):
    # Initializers reach onnxruntime as views of the mapping; the protobuf only names them.
    # (Weights held in Constant nodes are embedded: Constant -> initializer is a pass's job.)
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)  # 2 MiB
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 512])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1024])],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    write_mcpir(load_onnx(tmp_path / "m.onnx").model, tmp_path / "m.mcpir")
    rt = runtime.MCPIRModel(tmp_path / "m.mcpir", keep_proto=True)
    assert len(rt.onnx_bytes) < 1000 < w.nbytes
    x = np.ones((2, 512), np.float32)
    np.testing.assert_array_equal(rt.run({"x": x})[0], ort_run(tmp_path / "m.onnx", {"x": x})[0])


def test_runtime_rejects_corrupt_files(runtime, tmp_path):
    (tmp_path / "bad.mcpir").write_bytes(b"\0" * 64)
    with pytest.raises(runtime.MCPIRError, match="not an MCP-IR file"):
        runtime.MCPIRModel(tmp_path / "bad.mcpir")
    src = golden_dirs()[0] / "model.onnx"
    write_mcpir(load_onnx(src).model, tmp_path / "m.mcpir")
    data = (tmp_path / "m.mcpir").read_bytes()
    (tmp_path / "cut.mcpir").write_bytes(data[: len(data) - 100])
    with pytest.raises(runtime.MCPIRError, match="truncated"):
        runtime.MCPIRModel(tmp_path / "cut.mcpir")


BLOCKER = r'''
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("mcp_compiler", "onnx", "ml_dtypes", "google"):
            raise ImportError(f"the runtime must not import {name}")
sys.meta_path.insert(0, Block())
sys.path.insert(0, sys.argv[1])
import numpy as np
from mcp_runtime import MCPIRModel
m = MCPIRModel(sys.argv[2])
out = m.run({"x": np.load(sys.argv[3])["x"]})
np.save(sys.argv[4], out[0])
'''


def test_runtime_needs_only_numpy_flatbuffers_onnxruntime(tmp_path):
    d = golden_dirs()[-1]  # mlp
    write_runtime(tmp_path)
    write_mcpir(load_onnx(d / "model.onnx").model, tmp_path / "model.mcpir")
    r = subprocess.run([sys.executable, "-c", BLOCKER, str(tmp_path), str(tmp_path / "model.mcpir"),
                        str(d / "inputs.npz"), str(tmp_path / "out.npy")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    expected = ort_run(d / "model.onnx", dict(np.load(d / "inputs.npz")))[0]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
