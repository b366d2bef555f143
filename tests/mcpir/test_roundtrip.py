"""ONNX -> IR -> .mcpir -> IR -> ONNX is lossless: same structure, bit-identical ORT outputs."""

from __future__ import annotations

import mmap

import ml_dtypes
import numpy as np
import onnx
import pytest
from _helpers import ZOO_INPUTS, golden_dirs, light_models, ort_run, random_feeds, zoo_models, zoo_params
from onnx import TensorProto, helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir import ShapeExpr, TensorType
from mcp_compiler.lower import to_onnx
from mcp_compiler.mcpir import from_buffer, read_mcpir, to_bytes, write_mcpir


def _roundtrip(path, tmp_path):
    loaded = load_onnx(path)
    out = tmp_path / "m.mcpir"
    write_mcpir(loaded.model, out)
    back = read_mcpir(out)
    return loaded.model, back


def _same_structure(a, b):
    assert to_onnx(a).SerializeToString() == to_onnx(b).SerializeToString()


@pytest.mark.parametrize("d", golden_dirs(), ids=lambda d: d.name)
def test_golden_models(d, tmp_path):
    first, back = _roundtrip(d / "model.onnx", tmp_path)
    _same_structure(first, back)
    inputs = dict(np.load(d / "inputs.npz"))
    expected = np.load(d / "expected.npz")
    direct = ort_run(d / "model.onnx", inputs)
    after = ort_run(to_onnx(back), inputs)
    names = [o.name for o in onnx.load(d / "model.onnx").graph.output]
    for name, a, b in zip(names, direct, after):
        np.testing.assert_array_equal(a, b)  # no pass ran: bit-exact
        # onnxruntime vs onnx's reference evaluator: independent implementations.
        np.testing.assert_allclose(b, expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", zoo_params(), ids=lambda p: p.stem)
def test_zoo_models(path, tmp_path):
    first, back = _roundtrip(path, tmp_path)
    _same_structure(first, back)
    x = np.random.default_rng(0).random(ZOO_INPUTS[path.name], dtype=np.float32)
    for a, b in zip(ort_run(path, {"x": x}), ort_run(to_onnx(back), {"x": x})):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("path", light_models(), ids=lambda p: p.stem)
def test_onnx_light_models(path, tmp_path):
    first, back = _roundtrip(path, tmp_path)
    _same_structure(first, back)
    feeds = random_feeds(onnx.load(path), {"N": 1})
    for a, b in zip(ort_run(path, feeds), ort_run(to_onnx(back), feeds)):
        np.testing.assert_array_equal(a, b)


def test_zoo_is_present():
    # The shared zoo is part of this workplace; its absence would silently skip real models.
    assert len(zoo_models()) == 3
    assert len(light_models()) >= 9


ALL_DTYPES = [
    (TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64), (TensorProto.FLOAT16, np.float16),
    (TensorProto.BFLOAT16, ml_dtypes.bfloat16), (TensorProto.INT8, np.int8), (TensorProto.UINT8, np.uint8),
    (TensorProto.INT16, np.int16), (TensorProto.UINT16, np.uint16), (TensorProto.INT32, np.int32),
    (TensorProto.UINT32, np.uint32), (TensorProto.INT64, np.int64), (TensorProto.UINT64, np.uint64),
    (TensorProto.BOOL, np.bool_), (TensorProto.COMPLEX64, np.complex64),
    (TensorProto.COMPLEX128, np.complex128),
    (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn), (TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2),
    (TensorProto.FLOAT8E4M3FNUZ, ml_dtypes.float8_e4m3fnuz),
    (TensorProto.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz),
    (TensorProto.INT4, ml_dtypes.int4), (TensorProto.UINT4, ml_dtypes.uint4),
]


def _all_dtype_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []
    for i, (dt, npdt) in enumerate(ALL_DTYPES):
        shape = (3, 5)  # odd element count: exercises the half-filled last byte of int4
        if dt == TensorProto.BOOL:
            arr = rng.integers(0, 2, shape).astype(bool)
        elif dt in (TensorProto.INT4, TensorProto.UINT4):
            arr = rng.integers(-8 if dt == TensorProto.INT4 else 0, 8, shape).astype(npdt)
        else:
            arr = (rng.standard_normal(shape) * 3).astype(np.float32).astype(npdt)
        inits.append(numpy_helper.from_array(arr, f"w{i}"))
        nodes.append(helper.make_node("Identity", [f"w{i}"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", dt, list(shape)))
    inits.append(helper.make_tensor("s", TensorProto.STRING, [2], [b"hello", b"\xff\x00bytes"]))
    nodes.append(helper.make_node("Identity", ["s"], ["ys"]))
    outs.append(helper.make_tensor_value_info("ys", TensorProto.STRING, [2]))
    # Typed (non-raw) storage must be converted to raw form without changing the values.
    inits.append(helper.make_tensor("typed_f16", TensorProto.FLOAT16, [2], [1.5, -2.25]))
    inits.append(helper.make_tensor("typed_i4", TensorProto.INT4, [3], [-8, 7, 1]))
    g = helper.make_graph(nodes, "dtypes", [], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    return m


def test_every_dtype_survives(tmp_path):
    proto = _all_dtype_model()
    path = tmp_path / "dtypes.onnx"
    onnx.save(proto, path)
    model = load_onnx(path).model
    back = from_buffer(to_bytes(model))
    got = {v.name: v.const for v in back.graph.initializers.values()}
    assert got["s"].string_data == [b"hello", b"\xff\x00bytes"]  # bytes, not necessarily UTF-8
    for t in proto.graph.initializer:
        if t.data_type == TensorProto.STRING:
            continue
        want = numpy_helper.to_array(t)
        have = got[t.name].numpy()
        assert have.dtype == want.dtype, t.name
        np.testing.assert_array_equal(have.view(np.uint8) if have.dtype.kind == "V" else have,
                                      want.view(np.uint8) if want.dtype.kind == "V" else want)
    # int4 is packed two per byte in the file: 15 elements -> 8 bytes.
    assert got["w19"].nbytes == 8
    _same_structure(model, back)


def test_weights_are_aligned_views_of_the_mapping(tmp_path):
    proto = _all_dtype_model()
    onnx.save(proto, tmp_path / "m.onnx")
    write_mcpir(load_onnx(tmp_path / "m.onnx").model, tmp_path / "m.mcpir")
    back = read_mcpir(tmp_path / "m.mcpir")
    data = (tmp_path / "m.mcpir").read_bytes()
    for v in back.graph.initializers.values():
        t = v.const
        if t.string_data is not None:
            continue
        assert isinstance(t.raw.obj, mmap.mmap)  # lazy: a view of the mapped file, not a copy
        if t.dtype.packed:
            continue  # numpy() unpacks int4 into a new array; raw stays the view
        arr = t.numpy()
        assert not arr.flags.writeable
        if t.nbytes:
            addr = arr.__array_interface__["data"][0]
            base = np.frombuffer(t.raw.obj, np.uint8).__array_interface__["data"][0]
            assert (addr - base) % 64 == 0
            assert data[addr - base: addr - base + t.nbytes] == t.raw.tobytes()


def _with_attrs(node, *attrs):
    node.attribute.extend(attrs)
    return node


def test_control_flow_functions_sparse_and_metadata(tmp_path):
    # Subgraph attributes with outer-scope references, a model-local function with attribute
    # references and defaults, sparse initializers and attributes, metadata and doc strings.
    then_g = helper.make_graph([helper.make_node("Add", ["x", "c"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    fn = helper.make_function(
        "custom", "Scale", ["a"], ["b"],
        [helper.make_node("Constant", [], ["k"], value_float=1.0),
         helper.make_node("Mul", ["a", "k"], ["m"]),
         _with_attrs(helper.make_node("LeakyRelu", ["m"], ["b"]),
                     helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))],
        [helper.make_opsetid("", 18)], attributes=["alpha"])
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0], np.float32), "sp"),
        numpy_helper.from_array(np.array([1], np.int64), "sp_idx"), [2])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, doc_string="sum it"),
        helper.make_node("Greater", ["s", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["r"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Scale", ["r"], ["y"], domain="custom", alpha=0.5),
        helper.make_node("Constant", [], ["sc"], sparse_value=sparse),
        helper.make_node("Add", ["y", "sc"], ["z"]),
    ]
    g = helper.make_graph(
        nodes, "cf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "c"),
         numpy_helper.from_array(np.array(0.0, np.float32), "zero")], doc_string="graph doc")
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)],
                          functions=[fn], producer_name="test", doc_string="model doc")
    helper.set_model_props(m, {"author": "mcp", "license": "x"})
    path = tmp_path / "cf.onnx"
    onnx.save(m, path)
    model = load_onnx(path).model
    back = from_buffer(to_bytes(model))
    _same_structure(model, back)
    assert back.metadata_props == {"author": "mcp", "license": "x"}
    assert back.functions[0].body.nodes[2].attributes["alpha"].ref_attr_name == "alpha"
    for x in (np.array([1.0, 2.0], np.float32), np.array([-1.0, -2.0], np.float32)):
        for a, b in zip(ort_run(m, {"x": x}), ort_run(to_onnx(back), {"x": x})):
            np.testing.assert_array_equal(a, b)


def test_symbolic_dims_and_layout_contracts_roundtrip(tiny_model, tmp_path):
    from mcp_compiler.ir import Layout

    onnx.save(tiny_model, tmp_path / "t.onnx")
    model = load_onnx(tmp_path / "t.onnx").model
    x = model.graph.inputs[0]
    x.type = TensorType(x.type.elem_type, ("N", ShapeExpr("ceil_div", ShapeExpr("sub", "H", 1), 32), 4, None))
    x.layout = Layout.NHWC
    back = from_buffer(to_bytes(model))
    bx = back.graph.inputs[0]
    assert bx.type.shape == ("N", ShapeExpr("ceil_div", ShapeExpr("sub", "H", 1), 32), 4, None)
    assert bx.layout == Layout.NHWC


@pytest.mark.slow
def test_models_over_2gb_of_weights(tmp_path):
    # Two 1.1 GB tensors backed by a sparse file: the data section passes 2**31 bytes and the
    # second tensor's offset does not fit in 32 bits (no protobuf limit anywhere).
    from mcp_compiler.ir import DataType, Graph, Model, Tensor, Value
    from mcp_compiler.ir.graph import Node

    n = 1100 * 1024 * 1024
    blob = tmp_path / "blob.bin"
    with open(blob, "wb") as f:
        f.truncate(2 * n)
        f.seek(2 * n - 4)
        f.write(b"\x01\x02\x03\x04")
    with open(blob, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    g = Graph("big")
    a = Value("a", const=Tensor("a", DataType.UINT8, [n], memoryview(mm)[:n]))
    b = Value("b", const=Tensor("b", DataType.UINT8, [n], memoryview(mm)[n:]))
    g.initializers = {"a": a, "b": b}
    y = Value("y")
    g.nodes.append(Node("Add", [a, b], [y]))
    g.outputs.append(y)
    out = tmp_path / "big.mcpir"
    stats = write_mcpir(Model(g, {"": 17}), out)
    assert stats.data_bytes > 2**31
    back = read_mcpir(out)
    tb = back.graph.initializers["b"].const
    assert tb.nbytes == n
    assert bytes(tb.raw[-4:]) == b"\x01\x02\x03\x04"
    assert tb.raw.obj is back.graph.initializers["a"].const.raw.obj  # one mapping, two views


def test_library_session_uses_the_mapped_file(tmp_path):
    # create_session describes file-backed weights as external data of that file, and hands
    # in-memory ones over as OrtValues: both give the original's outputs.
    from mcp_compiler.session import create_session

    d = golden_dirs()[0]  # attention: 4 KiB weights, above the external threshold
    inputs = dict(np.load(d / "inputs.npz"))
    want = ort_run(d / "model.onnx", inputs)
    model = load_onnx(d / "model.onnx").model
    write_mcpir(model, tmp_path / "m.mcpir")
    for m in (model, read_mcpir(tmp_path / "m.mcpir")):
        for a, b in zip(want, create_session(m).run(None, inputs)):
            np.testing.assert_array_equal(a, b)


def test_equal_plain_attributes_are_written_once_and_read_back_each(tmp_path):
    """Equal number/list attributes (and equal attribute lists) share one table in the file; what
    differs in the bytes written (-0.0 and 0.0, 1 and 2) stays apart, and every node reads its own
    (-0.0 too: the builder left out a float equal to the field's default 0.0)."""
    from mcp_compiler.mcpir.writer import _Encoder

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    w = numpy_helper.from_array(np.ones((4, 1, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], group=4, pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Conv", ["c1", "w"], ["c2"], group=4, pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Conv", ["c2", "w"], ["c3"], group=4, pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("LeakyRelu", ["c3"], ["l1"], alpha=0.0),
             helper.make_node("LeakyRelu", ["l1"], ["y"], alpha=-0.0)]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = load_onnx(path).model
    enc = _Encoder(64)
    enc.model(model)
    # group=4, pads, strides=[1, 1], strides=[2, 2], alpha=0.0, alpha=-0.0; the first two Convs share their list
    assert len(enc._attributes) == 6 and len(enc._attribute_lists) == 4
    back = from_buffer(to_bytes(model))
    got = {n.outputs[0].name: {k: a.value for k, a in n.attributes.items()} for n in back.graph.nodes}
    assert [got[c]["strides"] for c in ("c1", "c2", "c3")] == [[1, 1], [1, 1], [2, 2]]
    assert np.signbit(got["l1"]["alpha"]) == False and np.signbit(got["y"]["alpha"]) == True  # noqa: E712
    _same_structure(model, back)
