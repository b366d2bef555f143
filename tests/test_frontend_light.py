"""The frontend hands onnx.checker and shape inference a light copy of the model: big initializers
and big Constants become typed graph inputs. What it imports must be what the whole model gives."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mcp_compiler.errors import InvalidModelError
from mcp_compiler.frontend import load_onnx
from mcp_compiler.frontend import onnx as frontend
from mcp_compiler.ir import DataType, TensorType
from mcp_compiler.ir.printer import print_model


def _model(path, *, clash: bool = False):
    """x -> MatMul(big Constant) -> Reshape(small Constant) -> Add(big initializer) -> y, and a
    If whose branch holds a big Constant (subgraphs are left as they are)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4096)).astype(np.float32)          # 128 KiB: a big Constant
    b = rng.standard_normal((4096,)).astype(np.float32)            # 16 KiB: stays
    big_b = rng.standard_normal((64, 512)).astype(np.float32)      # 128 KiB: a big initializer
    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(w[:, :2048].copy()))],
        "then", [], [helper.make_tensor_value_info("k", TensorProto.FLOAT, [8, 2048])])
    nodes = [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
        helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([-1, 64, 512], np.int64))),
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["mb"]),
        helper.make_node("Reshape", ["mb", "shape"], ["r"]),
        helper.make_node("Add", ["r", "big_b"], ["y"]),
        helper.make_node("If", ["cond"], ["k_out"], then_branch=branch, else_branch=branch),
    ]
    if clash:   # a second definition of the big Constant's output: not SSA, the checker must see it
        nodes.append(helper.make_node("Relu", ["x"], ["w"]))
    g = helper.make_graph(nodes, "light",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
                           helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64, 512]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 4096]),
                           helper.make_tensor_value_info("k_out", TensorProto.FLOAT, [8, 2048])],
                          initializer=[numpy_helper.from_array(b, "b"), numpy_helper.from_array(big_b, "big_b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_light_copy_moves_big_constants_and_initializers(tmp_path):
    proto = onnx.load(_model(tmp_path / "m.onnx"))
    light, added, moved = frontend._without_big_tensors(proto)
    assert sorted(added) == ["big_b", "w"]
    assert moved == {0}
    assert [n.output[0] for n in light.graph.node][:2] == ["shape", "mm"]   # the small Constant stays
    assert [t.name for t in light.graph.initializer] == ["b"]


def test_light_load_imports_what_the_whole_model_gives(tmp_path, monkeypatch):
    path = _model(tmp_path / "m.onnx")
    light = load_onnx(path).model
    monkeypatch.setattr(frontend, "_BIG_TENSOR", 1 << 40)   # nothing is big: the whole model is checked
    whole = load_onnx(path).model
    assert print_model(light) == print_model(whole)
    values = {v.name: v for n in light.graph.nodes for v in n.outputs}
    assert str(values["mm"].type) == str(TensorType(DataType.FLOAT, ("N", 4096)))   # inferred through the big Constant
    assert str(values["r"].type).endswith(",64,512])")   # and the small one (Reshape's -1 is a new symbol)
    w = next(n for n in light.graph.nodes if n.op_type == "Constant" and n.outputs[0].name == "w")
    assert tuple(w.attributes["value"].value.dims) == (8, 4096)


def test_a_big_constant_redefining_a_value_is_still_refused(tmp_path):
    with pytest.raises(InvalidModelError, match="onnx.checker rejected the model"):
        load_onnx(_model(tmp_path / "m.onnx", clash=True))


def _fixed(number: int, wire: int, payload: bytes) -> bytes:
    return bytes([number << 3 | wire]) + payload


@pytest.mark.parametrize("dt, np_dtype, field", [(TensorProto.FLOAT, "<f4", "float_data"),
                                                 (TensorProto.DOUBLE, "<f8", "double_data")])
def test_float_data_is_read_from_the_wire_form_whatever_its_encoding(tmp_path, dt, np_dtype, field):
    """Weights in float_data/double_data (Paddle's exports) are taken from the tensor's serialized
    bytes: packed (protobuf's own), element by element (another writer's), NaN and -0.0 bit for bit."""
    values = np.array([1.5, -0.0, np.nan, 3e38, -2.25, 7.0], np_dtype)
    packed = helper.make_tensor("w", dt, [6], values.tolist())
    assert len(getattr(packed, field)) == 6 and not packed.HasField("raw_data")
    number, wire, size = (4, 5, 4) if dt == TensorProto.FLOAT else (10, 1, 8)
    # the same tensor with its data written one element at a time, after the name and dims
    head = onnx.TensorProto(name="w", data_type=dt, dims=[6])
    loose = onnx.TensorProto()
    loose.ParseFromString(head.SerializeToString()
                          + b"".join(_fixed(number, wire, values[i:i + 1].tobytes()) for i in range(6)))
    # and an unknown field written as a group (kept by protobuf's parser) holding a field of the
    # same number: skipped, as protobuf skips it
    group = bytes([0x9B, 0x06]) + _fixed(number, wire, b"\0" * size) + bytes([0x9C, 0x06])   # field 99
    loose.ParseFromString(loose.SerializeToString() + group)
    assert len(getattr(loose, field)) == 6
    for t in (packed, loose):
        assert frontend._packed_field(t, number, size) == values.tobytes()
    empty = onnx.TensorProto(name="e", data_type=dt, dims=[0])
    assert frontend._packed_field(empty, number, size) == b""

    x = helper.make_tensor_value_info("x", dt, [6])
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x],
                          [helper.make_tensor_value_info("y", dt, [6])], initializer=[loose])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    w = load_onnx(tmp_path / "m.onnx").model.graph.initializers["w"]
    assert w.const.numpy().tobytes() == values.tobytes()


def test_an_attribute_name_that_is_not_utf8_is_refused_by_name(tmp_path):
    """Attribute names and ref_attr_names are checked without a message made per attribute: the
    one that is not UTF-8 is still named, with its node."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], name="t0", perm=[1, 0])], "g", [x], [y])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    assert data.count(b"perm") == 1
    (tmp_path / "m.onnx").write_bytes(data.replace(b"perm", b"per\xff"))
    with pytest.raises(InvalidModelError, match=r"an attribute name of 't0' is not valid UTF-8"):
        load_onnx(tmp_path / "m.onnx", check=False, infer_shapes=False)
