"""Corrupt, malformed and hostile inputs: one clear error line, exit 2, nothing written."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from _helpers import zoo_models
from onnx import TensorProto, helper
from typer.testing import CliRunner

from mcp_compiler.cli import app
from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir import Attribute, AttrType, Graph, Node, Value
from mcp_compiler.ir_schema import mcp_ir_generated as fb
from mcp_compiler.mcpir import to_bytes

runner = CliRunner()


def _convert_fails(src: Path, tmp_path: Path, expect: str) -> None:
    out = tmp_path / "out" / "model.mcpir"
    out.parent.mkdir(exist_ok=True)
    r = runner.invoke(app, ["convert", "--input", str(src), "--output", str(out)])
    _assert_clean_failure(r, expect)
    assert list(out.parent.iterdir()) == [], "a failed convert left files behind"


def _inspect_fails(src: Path, expect: str) -> None:
    _assert_clean_failure(runner.invoke(app, ["inspect", str(src)]), expect)


def _assert_clean_failure(r, expect: str) -> None:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert expect in lines[0], lines[0]


def _save(m: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(m.SerializeToString())
    return path


# -- ONNX ---------------------------------------------------------------------------------------

def test_missing_empty_garbage_and_truncated(tmp_path):
    _convert_fails(tmp_path / "nope.onnx", tmp_path, "No such file")
    (tmp_path / "empty.onnx").write_bytes(b"")
    _convert_fails(tmp_path / "empty.onnx", tmp_path, "file is empty")
    (tmp_path / "garbage.onnx").write_bytes(os.urandom(4096))
    _convert_fails(tmp_path / "garbage.onnx", tmp_path, "garbage.onnx")
    real = zoo_models()[0].read_bytes()
    (tmp_path / "trunc.onnx").write_bytes(real[: len(real) // 2])
    _convert_fails(tmp_path / "trunc.onnx", tmp_path, "trunc.onnx")


def test_undefined_value_and_duplicate_names(tmp_path, tiny_model):
    m = onnx.ModelProto()
    m.CopyFrom(tiny_model)
    m.graph.node[1].input[0] = "ghost"
    _convert_fails(_save(m, tmp_path / "undef.onnx"), tmp_path, "ghost")
    load_no_check = pytest.raises(Exception, match="undefined value 'ghost'")
    with load_no_check:
        load_onnx(tmp_path / "undef.onnx", check=False)  # our own check, not only the checker's
    m.CopyFrom(tiny_model)
    m.graph.node[1].output[0] = "h"
    _convert_fails(_save(m, tmp_path / "dup.onnx"), tmp_path, "dup.onnx")
    with pytest.raises(Exception, match="defined twice"):
        load_onnx(tmp_path / "dup.onnx", check=False)


def test_raw_data_size_mismatch(tmp_path, tiny_model):
    # onnx.checker accepts raw_data whose length does not match the dims; we do not.
    m = onnx.ModelProto()
    m.CopyFrom(tiny_model)
    m.graph.initializer[0].dims[:] = [2, 3]  # 48 bytes of data for 6 floats
    _convert_fails(_save(m, tmp_path / "size.onnx"), tmp_path, "need 24")
    m.graph.initializer[0].dims[:] = [4, 3000]
    with pytest.raises(Exception, match="need 48000"):
        load_onnx(_save(m, tmp_path / "small.onnx"), check=False)
    m.graph.initializer[0].dims[:] = [2**62, 4]
    _convert_fails(_save(m, tmp_path / "huge.onnx"), tmp_path, "huge.onnx")


def _external_model(tmp_path: Path, location: str, length: int | None = 48, offset: int = 0) -> Path:
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4, 3])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    t.external_data.add(key="offset", value=str(offset))
    if length is not None:
        t.external_data.add(key="length", value=str(length))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "ext",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [t])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    d = tmp_path / "model_dir"
    d.mkdir(exist_ok=True)
    return _save(m, d / "model.onnx")


@pytest.mark.parametrize("location, expect", [
    ("../../etc/passwd", "escapes the model folder"),
    ("/etc/passwd", "absolute path"),
    ("sub/../../secret.bin", "escapes the model folder"),
    ("missing.bin", "file not found"),
])
def test_external_data_outside_the_folder(tmp_path, location, expect):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 48)
    _convert_fails(_external_model(tmp_path, location), tmp_path, expect)


def test_external_data_symlink_and_hardlink_out(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 48)
    src = _external_model(tmp_path, "link.bin")
    os.symlink(secret, src.parent / "link.bin")
    _convert_fails(src, tmp_path, "outside the model folder")
    src = _external_model(tmp_path, "hard.bin")
    os.link(secret, src.parent / "hard.bin")
    _convert_fails(src, tmp_path, "hard link")


def test_external_data_lengths(tmp_path):
    src = _external_model(tmp_path, "w.bin", length=10**12)
    (src.parent / "w.bin").write_bytes(np.ones(12, np.float32).tobytes())
    _convert_fails(src, tmp_path, "runs past the end")
    src = _external_model(tmp_path, "w.bin", length=40)
    _convert_fails(src, tmp_path, "holds 40 bytes")


def test_valid_external_data_loads_as_a_view(tmp_path):
    src = _external_model(tmp_path, "w.bin", length=None, offset=16)
    w = np.arange(12, dtype=np.float32)
    (src.parent / "w.bin").write_bytes(b"\0" * 16 + w.tobytes())
    model = load_onnx(src).model
    np.testing.assert_array_equal(model.graph.initializers["W"].const.numpy().ravel(), w)


# -- MCP-IR -------------------------------------------------------------------------------------

@pytest.fixture
def mcpir_bytes(tiny_model, tmp_path) -> bytes:
    return to_bytes(load_onnx(_save(tiny_model, tmp_path / "tiny.onnx")).model)


def _tensor_field(data: bytes, index: int, slot: int) -> int:
    """Absolute file position of field `slot` of initializer `index` (to corrupt it)."""
    root = fb.Model.GetRootAs(data[4:], 0)
    t = root.Graph().Initializers(index)
    rel = t._tab.Offset(4 + 2 * slot)
    assert rel, "field not present"
    return 4 + t._tab.Pos + rel


def _patch(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


OFFSET_SLOT, LENGTH_SLOT = 3, 4  # Tensor.offset / Tensor.length in mcp_ir.fbs


def test_mcpir_corruptions(tmp_path, mcpir_bytes):
    d = mcpir_bytes
    cases = {
        "ident": (d[:8] + b"XXXX" + d[12:], "not an MCP-IR file"),
        "truncated": (d[: len(d) - 40], "runs past the end of the file"),
        "header": (_patch(d, 0, "<I", len(d) * 4), "header claims"),
        "offset": (_patch(d, _tensor_field(d, 1, OFFSET_SLOT), "<Q", 2**40), "outside the data section"),
        "misaligned": (_patch(d, _tensor_field(d, 1, OFFSET_SLOT), "<Q", 65), "not 64-byte aligned"),
        "overlap": (_patch(d, _tensor_field(d, 1, OFFSET_SLOT), "<Q", 0), "overlap"),
        "length": (_patch(d, _tensor_field(d, 1, LENGTH_SLOT), "<Q", 2**62), "record of"),
        "negative-root": (d[:4] + struct.pack("<I", 2**31 + 5) + d[8:], "corrupt MCP-IR"),
    }
    for name, (data, expect) in cases.items():
        p = tmp_path / f"{name}.mcpir"
        p.write_bytes(data)
        _inspect_fails(p, expect)


def test_mcpir_vector_length_larger_than_buffer(tmp_path, mcpir_bytes):
    d = mcpir_bytes
    root = fb.Model.GetRootAs(d[4:], 0)
    g = root.Graph()
    vec = g._tab.Vector(g._tab.Offset(6))  # Graph.nodes is slot 1 -> vtable offset 6
    p = tmp_path / "vec.mcpir"
    p.write_bytes(_patch(d, 4 + vec - 4, "<I", 0x7FFFFFFF))
    _inspect_fails(p, "runs past the end")


def test_mcpir_deep_subgraph_nesting_is_refused(tmp_path):
    # 100 nested If subgraphs: written fine, refused by the reader before recursion trouble.
    inner = Graph("g0")
    for i in range(100):
        outer = Graph(f"g{i + 1}")
        c = Value(f"c{i}")
        outer.inputs.append(c)
        out = Value(f"o{i}")
        outer.nodes.append(Node("If", [c], [out], attributes=[
            Attribute("then_branch", AttrType.GRAPH, inner),
            Attribute("else_branch", AttrType.GRAPH, Graph("leaf"))]))
        outer.outputs.append(out)
        inner = outer
    from mcp_compiler.ir import Model

    p = tmp_path / "deep.mcpir"
    p.write_bytes(to_bytes(Model(inner, {"": 17})))
    _inspect_fails(p, "corrupt MCP-IR")


def test_random_bytes_with_identifier(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(20):
        data = bytearray(rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())
        data[8:12] = b"MCPI"
        data[0:4] = struct.pack("<I", 1500)
        p = tmp_path / f"r{i}.mcpir"
        p.write_bytes(bytes(data))
        _inspect_fails(p, "r")


def test_an_ir3_models_initializer_inputs_are_constants(tmp_path):
    """Before IR 4 every initializer was also listed as an input; onnxruntime does not let a caller
    feed them, and neither does the import: they are plain initializers, the model IR 4."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from mcp_compiler.frontend import load_onnx

    w = numpy_helper.from_array(np.ones((2,), np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)])
    m.ir_version = 3
    onnx.save(m, tmp_path / "m.onnx")
    model = load_onnx(tmp_path / "m.onnx").model
    assert [v.name for v in model.graph.inputs] == ["x"] and "w" in model.graph.initializers
    assert model.ir_version == 4
