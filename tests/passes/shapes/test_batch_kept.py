"""Issue 30 #5: the batch dim survives an Expand to a computed shape (torch's expand(B, -1, -1) of a
ViT's class token), onnxruntime's dynamic quantization, and a Loop's outputs (a tf2onnx recurrence):
each model, its outputs declared with exporter-style dims, is emitted batching and verifies."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from mcp_compiler import CompileOptions, compile_model

F = T.FLOAT


def _models(d):
    def save(name, nodes, ins, outs, inits):
        onnx.save(h.make_model(h.make_graph(nodes, name, ins, outs, inits), opset_imports=[h.make_opsetid("", 17)]),
                  d / f"{name}.onnx")

    rng = np.random.default_rng(0)
    # A: torch's expand(B, -1, -1) of a class token, concatenated before the patches (a ViT)
    save("vit", [
        h.make_node("Shape", ["x"], ["sh"]), h.make_node("Gather", ["sh", "zero"], ["b"], axis=0),
        h.make_node("Unsqueeze", ["b", "ax0"], ["b1"]), h.make_node("Concat", ["b1", "m1", "m1"], ["size0"], axis=0),
        h.make_node("Reshape", ["size0", "m1"], ["size"]),
        h.make_node("Shape", ["size"], ["ssh"]), h.make_node("ConstantOfShape", ["ssh"], ["ones"], value=nh.from_array(np.array([1], np.int64))),
        h.make_node("Mul", ["ones", "m1s"], ["neg"]), h.make_node("Equal", ["size", "neg"], ["eq"]),
        h.make_node("Where", ["eq", "ones", "size"], ["size2"]), h.make_node("Expand", ["cls", "size2"], ["e"]),
        h.make_node("Concat", ["e", "x"], ["y"], axis=1)],
        [h.make_tensor_value_info("x", F, ["batch", 4, 8])], [h.make_tensor_value_info("y", F, ["batch", 5, 8])],
        [nh.from_array(np.array(0, np.int64), "zero"), nh.from_array(np.array([0], np.int64), "ax0"),
         nh.from_array(np.array([-1], np.int64), "m1"), nh.from_array(np.array(-1, np.int64), "m1s"),
         nh.from_array(rng.standard_normal((1, 1, 8)).astype(np.float32), "cls")])
    # B: onnxruntime's dynamic quantization of a MatMul
    wq = rng.integers(0, 255, (16, 8)).astype(np.uint8)
    save("dq", [
        h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        h.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["acc"]), h.make_node("Cast", ["acc"], ["accf"], to=F),
        h.make_node("Mul", ["xs", "ws"], ["s"]), h.make_node("Mul", ["accf", "s"], ["y"])],
        [h.make_tensor_value_info("x", F, ["batch", 16])], [h.make_tensor_value_info("y", F, ["unk__1", 8])],
        [nh.from_array(wq, "wq"), nh.from_array(np.array(128, np.uint8), "wz"), nh.from_array(np.array(0.01, np.float32), "ws")])
    # C: a recurrence as a Loop (tf2onnx), its scan output transposed to batch-first
    body = h.make_graph([h.make_node("Identity", ["c_in"], ["c_out"]), h.make_node("MatMul", ["h_in", "w"], ["m"]),
                         h.make_node("Tanh", ["m"], ["h_out"]), h.make_node("Identity", ["h_out"], ["scan"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
                         h.make_tensor_value_info("h_in", F, None)],
                        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("h_out", F, None),
                         h.make_tensor_value_info("scan", F, None)])
    save("loop", [h.make_node("Loop", ["M", "c", "x"], ["hf", "seq"], body=body),
                  h.make_node("Transpose", ["seq"], ["y"], perm=[1, 0, 2])],
         [h.make_tensor_value_info("x", F, ["batch", 8])],
         [h.make_tensor_value_info("hf", F, ["unk__2", 8]), h.make_tensor_value_info("y", F, ["unk__3", "unk__4", 8])],
         [nh.from_array(np.array(3, np.int64), "M"), nh.from_array(np.array(True), "c"),
          nh.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")])


@pytest.mark.parametrize("name", ["vit", "dq", "loop"])
def test_batch_is_kept(tmp_path, name):
    _models(tmp_path)
    r = compile_model(tmp_path / f"{name}.onnx", tmp_path / "repo", CompileOptions.for_target("triton-v1.12", name, verify=True))
    assert not any("dynamic batching off" in w for w in r.warnings), r.warnings
    assert "max_batch_size: 8" in (tmp_path / "repo" / name / "config.pbtxt").read_text()
    assert r.verification["ok"]
