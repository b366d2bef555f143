"""Symbolic shape inference: dims as expressions over the input symbols, checked against the
shapes onnxruntime actually produces for every value at several concrete input sizes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from _helpers import ort_run, zoo_models, zoo_params
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from mcp_compiler import CompileOptions, api
from mcp_compiler.cli import app
from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir import TensorType
from mcp_compiler.ir.dims import ShapeExpr
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PassContext
from mcp_compiler.passes.shapes import SymbolicShapesPass
from mcp_compiler.passes.shapes import algebra as A
from mcp_compiler.pipeline import build

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def test_algebra_normal_form():
    h = "H"
    assert A.floor_div(A.add(A.mul(h, 2), 2), 2) == A.add(h, 1)
    assert A.sub(A.add(h, 3), h) == 3
    assert A.floor_div(A.floor_div(A.sub(h, 1), 2), 16) == A.floor_div(A.sub(h, 1), 32)
    assert A.mul("W", h) == A.mul(h, "W")
    assert A.mul(A.mul(h, 3), "W") == A.mul(A.mul(h, "W"), 3)
    assert A.mul(A.add(h, 1), "W") == A.add(A.mul(h, "W"), "W")
    assert A.ceil_div(h, 4) == A.floor_div(A.add(h, 3), 4)
    assert A.dmin(A.add(h, 2), h) == h
    assert A.substitute(A.add(A.mul(h, 2), 1), {"H": 5}) == 11
    e = A.add(A.floor_div(A.sub(h, 3), 2), 1)
    for v in range(3, 40):
        assert A.evaluate(e, {"H": v}) == (v - 3) // 2 + 1
    assert str(A.add(A.floor_div(A.sub(h, 1), 32), 1)) == "(((H - 1) // 32) + 1)"


def test_what_the_algebra_builds_is_already_normal():
    # norm() returns an expression the algebra built as it is: that holds only if building the
    # form of such an expression again gives the same expression
    h, w = "H", "W"
    made = [A.add(A.mul(h, 2), 3), A.sub(w, A.mul(h, 3)), A.floor_div(A.sub(h, 1), 2), A.mul(A.add(h, 1), w),
            A.add(A.floor_div(A.add(h, 1), 2), A.floor_div(A.sub(w, 3), 4)), A.ceil_div(A.mul(h, w), 8),
            A.sub(A.dmin(h, w), 1), A.mul(A.floor_div(h, 2), A.add(w, -5)), A.sub(3, A.mul(w, h))]
    for e in made:
        assert isinstance(e, ShapeExpr), e
        assert A.norm(e) is e
        again = A.build(A.linear(e))
        assert again == e and str(again) == str(e)
    unmade = ShapeExpr("add", ShapeExpr("add", h, 1), ShapeExpr("sub", h, 1))   # as a model may state it
    assert A.norm(unmade) == A.mul(h, 2)


def _check_against_ort(model, feeds: dict) -> tuple[int, int]:
    """Every node output's inferred dims, evaluated at the feeds' sizes, equal onnxruntime's
    shapes; returns (dims checked, dims that were symbols inference could not tie to inputs)."""
    env: dict[str, int] = {}
    for v in model.graph.inputs:
        if v.name in feeds:
            for d, n in zip(v.type.shape, feeds[v.name].shape):
                if isinstance(d, str):
                    env[d] = n
                elif d is not None and not isinstance(d, ShapeExpr):
                    assert d == n, v.name
    ours = {o.name: o.type.shape for n in model.graph.nodes for o in n.outputs
            if isinstance(o.type, TensorType) and o.type.shape is not None}
    proto = to_onnx(model, value_info=True)
    have = {o.name for o in proto.graph.output}
    proto.graph.output.extend(v for v in proto.graph.value_info if v.name not in have and v.name in ours)
    names = [o.name for o in proto.graph.output]
    got = dict(zip(names, ort_run(proto, feeds)))
    checked = free = 0
    for name, arr in got.items():
        shape = ours[name]
        assert len(shape) == arr.ndim, name
        for axis, (d, n) in enumerate(zip(shape, arr.shape)):
            value = A.evaluate(d, env)
            if value is None:
                free += 1
                continue
            assert value == n, f"{name} axis {axis}: inferred {d} = {value}, onnxruntime {n}"
            checked += 1
    return checked, free


@pytest.mark.parametrize("path", zoo_params(), ids=lambda p: p.stem)
def test_zoo_shapes_match_onnxruntime(path):
    from mcp_compiler.targets import get_target

    model = load_onnx(path).model
    build(get_target("triton-v1.12")).run(model)
    out = model.graph.outputs[0].type.shape
    inp = model.graph.inputs[0].type.shape
    assert out[0] == inp[0], "the batch symbol reaches the output"
    sizes = {"det": [(1, 64, 96), (2, 96, 128)], "rec": [(1, 48, 320), (3, 48, 160)],
             "cls": [(2, 48, 192), (1, 48, 96)]}[path.stem.split("_")[-2]]
    for n, h, w in sizes:
        feeds = {"x": np.random.default_rng(0).standard_normal((n, 3, h, w)).astype(np.float32)}
        checked, free = _check_against_ort(model, feeds)
        assert checked > 300 and free == 0, (checked, free)


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _shape_ops_model() -> onnx.ModelProto:
    """x[N, C, H, W]: Shape -> Gather -> Concat -> Reshape, Slice, Split, Pad, Resize, Flatten,
    Transpose, MatMul with a batch, Concat, ReduceMean and a -1 Reshape."""
    i = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)  # noqa: E731
    inits = [i("zero", [0]), i("one", [1]), i("two3", [2, 3]), i("neg1", [-1]), i("pads", [0, 0, 1, 2, 0, 0, 3, 4]),
             i("s_start", [1]), i("s_end", [-1]), i("ax2", [2]), i("split", [1, 2]), i("ax1", [1]),
             numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales"),
             i("w_cols", [6]), i("ax3", [3]),
             numpy_helper.from_array(np.ones((6, 5), dtype=np.float32), "w")]
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "zero"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "neg1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),              # [N, C*H*W]
        helper.make_node("Slice", ["x", "s_start", "s_end", "ax2"], ["sl"]),  # H -> H - 2
        helper.make_node("Split", ["x", "split"], ["c1", "c2"], axis=1),     # C = 3
        helper.make_node("Pad", ["x", "pads"], ["pd"]),                      # H+4, W+6
        helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest"),
        helper.make_node("Flatten", ["x"], ["fl"], axis=2),
        helper.make_node("Transpose", ["x"], ["tr"], perm=[0, 2, 3, 1]),
        helper.make_node("Slice", ["tr", "zero", "one", "ax1"], ["row"]),      # [N, 1, W, C]
        helper.make_node("Shape", ["x"], ["tail"], start=2),
        helper.make_node("Concat", ["n", "two3", "tail"], ["t2"], axis=0),
        helper.make_node("Identity", ["t2"], ["t2i"]),
        helper.make_node("ReduceMean", ["x", "ax1"], ["rm"], keepdims=0),
        helper.make_node("Concat", ["x", "x"], ["cc"], axis=3),              # W -> 2W
        helper.make_node("Reshape", ["tr", "neg1"], ["all"]),
        helper.make_node("Slice", ["cc", "zero", "w_cols", "ax3"], ["cc5"]),
        helper.make_node("MatMul", ["cc5", "w"], ["mm"]),
    ]
    x = helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])
    ranks = {"flat": 2, "sl": 4, "c1": 4, "c2": 4, "pd": 4, "up": 4, "fl": 2, "row": 4, "rm": 3,
             "all": 1, "mm": 4}
    outs = [helper.make_tensor_value_info(n, F, [None] * r) for n, r in ranks.items()]
    outs.append(helper.make_tensor_value_info("t2i", I64, [None]))
    return _model(nodes, [x], outs, inits)


def test_shape_ops_match_onnxruntime(tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(_shape_ops_model(), p)
    model = load_onnx(p).model
    result = SymbolicShapesPass().run(model, PassContext())
    assert result.modified and result.stats["conflicts"] == 0
    shapes = {v.name: v.type.shape for v in model.graph.outputs}
    assert shapes["flat"] == ("N", A.mul(A.mul("H", "W"), 3))
    assert shapes["sl"] == ("N", 3, A.sub("H", 2), "W")
    assert shapes["pd"] == ("N", 3, A.add("H", 4), A.add("W", 6))
    assert shapes["up"] == ("N", 3, A.mul("H", 2), A.mul("W", 2))
    assert shapes["row"] == ("N", A.dmin("H", 1), "W", 3)   # H may be 0: min(H, 1)
    for n, h, w in [(1, 5, 6), (2, 7, 3)]:
        feeds = {"x": np.random.default_rng(1).standard_normal((n, 3, h, w)).astype(np.float32)}
        checked, free = _check_against_ort(model, feeds)
        assert free == 0 and checked > 30


def test_unnamed_dims_get_fresh_symbols_and_conflicts_are_reported(tmp_path):
    x = helper.make_tensor_value_info("x", F, [None, 4])
    y = helper.make_tensor_value_info("y", F, ["?", 5])   # declared wrong: Relu keeps 4
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    s = api.inspect(p)
    assert s.inputs[0].shape == ["x_d0", 4]
    # a graph output's contract is what the model returns: the inferred size wins, and is reported
    assert s.outputs[0].shape == ["x_d0", 4]
    assert any("'y' axis 1: 4 inferred, 5 declared; the output contract uses the inferred size" in c
               for c in s.shape_conflicts)


def test_conv_pool_chain_gives_expressions(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), dtype=np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 3, "H", "W"])],
               [helper.make_tensor_value_info("y", F, [None] * 4)], [w])
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    model = load_onnx(p).model
    SymbolicShapesPass().run(model, PassContext())
    # conv: (H + 2 - 3) // 2 + 1 = (H - 1) // 2 + 1 = C; pool: (C - 2) // 2 + 1
    c = A.add(A.floor_div(A.sub("H", 1), 2), 1)
    assert model.graph.outputs[0].type.shape[2] == A.add(A.floor_div(A.sub(c, 2), 2), 1)
    for h in (8, 9, 17):
        checked, free = _check_against_ort(model, {"x": np.zeros((1, 3, h, h + 3), np.float32)})
        assert free == 0


def test_inspect_cli_shows_contracts(tmp_path):
    paths = [p for p in zoo_models() if "cls" in p.name]
    r = CliRunner().invoke(app, ["inspect", str(paths[0]), "--json", "--values"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["inputs"][0]["shape"] == ["x_d0", 3, "x_d2", "x_d3"]
    assert d["outputs"][0]["shape"] == ["x_d0", 2]
    assert len(d["values"]) > 500 and d["shape_conflicts"] == []


def test_zoo_models_get_dynamic_batching(tmp_path):
    for path in zoo_models():
        r = api.compile_model(path, tmp_path / "repo", CompileOptions.for_target("triton-v1.12", force=True))
        assert not any("dynamic batching off" in w for w in r.warnings), (path.name, r.warnings)
        config = (Path(r.output) / "config.pbtxt").read_text()
        assert "max_batch_size: 8" in config, path.name
