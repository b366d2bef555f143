"""Builds the golden models from code: `python golden_models/build.py [NAME ...]`.

Each model gets a folder `golden_models/<name>/` with `model.onnx`, `inputs.npz` (seeded random
inputs) and `expected.npz`: outputs computed by onnx's reference evaluator (not onnxruntime, so
that the tests compare two independent implementations).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

HERE = Path(__file__).resolve().parent
OPSET = 17
F = TensorProto.FLOAT


def _w(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.2) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(graph: onnx.GraphProto, opset: int = OPSET, **kw) -> onnx.ModelProto:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="mcp-cli golden_models", **kw)
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def mlp(rng):
    """Gemm/MatMul+Add MLP with Relu and Softmax; batch is the symbol N."""
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("MatMul", ["a1", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "b2"], ["h3"]),
        helper.make_node("Softmax", ["h3"], ["y"], axis=-1),
    ]
    g = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", F, ["N", 16])],
        [helper.make_tensor_value_info("y", F, ["N", 10])],
        [_w(rng, "w1", 32, 16), _w(rng, "b1", 32), _w(rng, "w2", 32, 10), _w(rng, "b2", 10)])
    return _model(g), {"x": rng.standard_normal((3, 16)).astype(np.float32)}


def convnet(rng):
    """Conv + BatchNormalization + Relu + MaxPool + Conv + GlobalAveragePool + Flatten + Gemm (NCHW)."""
    bn = [numpy_helper.from_array(a.astype(np.float32), n) for a, n in (
        (rng.uniform(0.5, 1.5, 8), "bn_scale"), (rng.standard_normal(8) * 0.1, "bn_bias"),
        (rng.standard_normal(8) * 0.1, "bn_mean"), (rng.uniform(0.5, 1.5, 8), "bn_var"))]
    nodes = [
        helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2w"], ["c2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fcw", "fcb"], ["logits"], transB=1),
    ]
    inits = [_w(rng, "c1w", 8, 3, 3, 3), _w(rng, "c1b", 8), *bn, _w(rng, "c2w", 16, 8, 3, 3),
             numpy_helper.from_array(np.array(0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6, np.float32), "hi"),
             _w(rng, "fcw", 5, 16), _w(rng, "fcb", 5)]
    g = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("logits", F, ["N", 5])], inits)
    return _model(g), {"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32)}


def attention(rng):
    """One self-attention block: QKV projections, heads via Reshape/Transpose, Softmax, LayerNorm."""
    d, h = 16, 2
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Reshape", ["q", "heads"], ["qh"]),
        helper.make_node("Reshape", ["k", "heads"], ["kh"]),
        helper.make_node("Reshape", ["v", "heads"], ["vh"]),
        helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["vh"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vt"], ["o"]),
        helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "merge"], ["om"]),
        helper.make_node("MatMul", ["om", "wo"], ["proj"]),
        helper.make_node("Add", ["proj", "x"], ["res"]),
        helper.make_node("LayerNormalization", ["res", "ln_g", "ln_b"], ["y"], axis=-1),
    ]
    inits = [_w(rng, n, d, d) for n in ("wq", "wk", "wv", "wo")] + [
        numpy_helper.from_array(np.array([0, 0, h, d // h], np.int64), "heads"),
        numpy_helper.from_array(np.array([0, 0, d], np.int64), "merge"),
        numpy_helper.from_array(np.array(1 / np.sqrt(d // h), np.float32), "scale"),
        numpy_helper.from_array(np.ones(d, np.float32), "ln_g"),
        numpy_helper.from_array(np.zeros(d, np.float32), "ln_b")]
    g = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", F, ["B", "S", d])],
                          [helper.make_tensor_value_info("y", F, ["B", "S", d])], inits)
    return _model(g), {"x": rng.standard_normal((2, 5, d)).astype(np.float32)}


def control_flow(rng):
    """If whose branches read outer-scope values, and a Loop that accumulates (a cumulative sum)."""
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", F, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", F, None)])
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan_out"])],
        "body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, None),
         helper.make_tensor_value_info("scan_out", F, None)])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["branch"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trip", "go", "init"], ["acc", "steps"], body=body),
    ]
    inits = [_w(rng, "w", 4), numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(3, np.int64), "trip"),
             numpy_helper.from_array(np.array(True), "go"),
             numpy_helper.from_array(np.zeros(4, np.float32), "init")]
    g = helper.make_graph(nodes, "control_flow", [helper.make_tensor_value_info("x", F, [4])],
                          [helper.make_tensor_value_info("branch", F, [4]),
                           helper.make_tensor_value_info("acc", F, [4]),
                           helper.make_tensor_value_info("steps", F, [3, 4])], inits)
    return _model(g), {"x": rng.standard_normal(4).astype(np.float32)}


def dynamic_dims(rng):
    """Shape arithmetic on symbolic dims: Shape/Gather/Div/Concat/Reshape, Slice and Concat."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "idx0"], ["b"], axis=0),
        helper.make_node("Gather", ["shp", "idx1"], ["t"], axis=0),
        helper.make_node("Div", ["t", "two"], ["half"]),
        helper.make_node("Concat", ["b", "half", "two", "neg1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["r"]),
        helper.make_node("ReduceMean", ["r"], ["pooled"], axes=[2], keepdims=0),
        helper.make_node("Slice", ["x", "s_start", "s_end", "s_axes"], ["head"]),
        helper.make_node("Concat", ["head", "x"], ["y2"], axis=1),
    ]
    i64 = lambda a, n: numpy_helper.from_array(np.array(a, np.int64), n)  # noqa: E731
    inits = [i64([0], "idx0"), i64([1], "idx1"), i64([2], "two"), i64([-1], "neg1"),
             i64([0], "s_start"), i64([1], "s_end"), i64([1], "s_axes")]
    g = helper.make_graph(nodes, "dynamic_dims", [helper.make_tensor_value_info("x", F, ["batch", "time", 8])],
                          [helper.make_tensor_value_info("pooled", F, ["batch", None, 8]),
                           helper.make_tensor_value_info("y2", F, ["batch", None, 8])], inits)
    return _model(g), {"x": rng.standard_normal((2, 6, 8)).astype(np.float32)}


MODELS = {f.__name__: f for f in (mlp, convnet, attention, control_flow, dynamic_dims)}


def build(name: str, out: Path = HERE) -> Path:
    rng = np.random.default_rng(sum(map(ord, name)))
    model, inputs = MODELS[name](rng)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(model, d / "model.onnx")
    np.savez(d / "inputs.npz", **inputs)
    outs = ReferenceEvaluator(model).run(None, inputs)
    np.savez(d / "expected.npz", **{o.name: v for o, v in zip(model.graph.output, outs)})
    return d


if __name__ == "__main__":
    for n in sys.argv[1:] or MODELS:
        print(build(n))
