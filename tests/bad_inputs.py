"""Generates the bad-input corpus: corrupt, malformed and hostile ONNX and MCP-IR files.

`python tests/bad_inputs.py OUT_DIR` writes every case to OUT_DIR/<name>/ (the file to convert
is `input.onnx` or `input.mcpir`, with whatever it refers to beside it) and prints their names.
The tests build the same corpus in a temp folder; nothing here is a hand-kept file.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),), ir_version=8) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = ir_version
    return m


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def good_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    return _model([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                  [_vi("x", ["N", 4])], [_vi("y", ["N", 8])],
                  [numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "W")])


def _write(d: Path, m: onnx.ModelProto | bytes, name: str = "input.onnx") -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(m if isinstance(m, bytes) else m.SerializeToString())


def _external(d: Path, location: str, *, offset: int = 0, length: int | None = 128) -> None:
    t = TensorProto(name="W", data_type=F, dims=[4, 8])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset))) + ((("length", str(length)),) if length is not None else ()):
        t.external_data.add(key=k, value=v)
    m = _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [_vi("x", [1, 4])], [_vi("y", [1, 8])], [t])
    _write(d, m)


# -- ONNX cases -----------------------------------------------------------------------------------

def _rejected_flips(good: bytes, count: int) -> list[bytes]:
    """Bit-flipped copies of `good` that onnx itself (parser or checker) rejects: flips that only
    change weight values make valid models, which are not bad input."""
    rng = np.random.default_rng(7)
    out = []
    while len(out) < count:
        b = bytearray(good)
        for p in rng.choice(len(b), 3, replace=False):
            b[p] ^= int(rng.integers(1, 256))
        try:
            onnx.checker.check_model(onnx.ModelProto.FromString(bytes(b)), full_check=True)
        except Exception:  # noqa: BLE001 - any rejection by onnx is what we want here
            out.append(bytes(b))
    return out


def onnx_cases() -> dict[str, Callable[[Path], None]]:
    good = good_model().SerializeToString()
    cases: dict[str, Callable[[Path], None]] = {}
    for frac in (0.05, 0.3, 0.5, 0.9, 0.99):
        cases[f"truncated_{int(frac * 100)}"] = lambda d, f=frac: _write(d, good[: int(len(good) * f)])
    rng = np.random.default_rng(7)
    for i, data in enumerate(_rejected_flips(good, 8)):
        cases[f"bitflip_{i}"] = lambda d, data=data: _write(d, data)
    cases["empty"] = lambda d: _write(d, b"")
    cases["garbage"] = lambda d: _write(d, bytes(rng.integers(0, 256, 5000, dtype=np.uint8)))
    cases["not_onnx_text"] = lambda d: _write(d, b"name: 'model'\ngraph { }\n")
    cases["cycle"] = lambda d: _write(d, _model(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
        [_vi("x", [2])], [_vi("b", [2])]))
    cases["undefined_input"] = lambda d: _write(d, _model(
        [helper.make_node("Add", ["x", "ghost"], ["y"])], [_vi("x", [2])], [_vi("y", [2])]))
    cases["duplicate_names"] = lambda d: _write(d, _model(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
        [_vi("x", [2])], [_vi("y", [2])]))
    cases["undefined_output"] = lambda d: _write(d, _model(
        [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("nowhere", [2])]))

    def absurd_dims(d):
        t = TensorProto(name="W", data_type=F, dims=[2**62, 2**62])
        t.raw_data = b"\0" * 16
        _write(d, _model([helper.make_node("Identity", ["W"], ["y"])], [], [_vi("y", None)], [t]))
    cases["absurd_dims"] = absurd_dims

    def negative_dims(d):
        t = TensorProto(name="W", data_type=F, dims=[-4, 2])
        t.raw_data = b"\0" * 32
        _write(d, _model([helper.make_node("Identity", ["W"], ["y"])], [], [_vi("y", None)], [t]))
    cases["negative_dims"] = negative_dims

    def size_mismatch(d):
        t = TensorProto(name="W", data_type=F, dims=[2, 2])
        t.raw_data = b"\0" * 64  # 16 floats of data for 4
        _write(d, _model([helper.make_node("Identity", ["W"], ["y"])], [], [_vi("y", [2, 2])], [t]))
    cases["size_mismatch"] = size_mismatch

    def zero_size_with_data(d):
        t = TensorProto(name="W", data_type=F, dims=[0, 3])
        t.raw_data = b"\0" * 12
        _write(d, _model([helper.make_node("Identity", ["W"], ["y"])], [], [_vi("y", [0, 3])], [t]))
    cases["zero_size_with_data"] = zero_size_with_data
    cases["ext_parent_traversal"] = lambda d: _external(d, "../../etc/passwd")
    cases["ext_nested_traversal"] = lambda d: _external(d, "a/../../../etc/passwd")
    cases["ext_absolute"] = lambda d: _external(d, "/etc/passwd")

    def ext_symlink(d):
        _external(d, "w.bin")
        os.symlink("/etc/passwd", d / "w.bin")
    cases["ext_symlink_out"] = ext_symlink

    def ext_parent_symlink(d):
        _external(d, "sub/w.bin")
        os.symlink("/etc", d / "sub")
    cases["ext_parent_folder_symlink"] = ext_parent_symlink

    def ext_hardlink(d):
        _external(d, "w.bin")
        outside = d.parent / f"{d.name}_outside.bin"
        outside.write_bytes(b"\0" * 128)
        os.link(outside, d / "w.bin")
    cases["ext_hardlink"] = ext_hardlink

    def ext_huge_length(d):
        _external(d, "w.bin", length=2**62)
        (d / "w.bin").write_bytes(b"\0" * 128)
    cases["ext_huge_length"] = ext_huge_length

    def ext_offset_past_end(d):
        _external(d, "w.bin", offset=10**9)
        (d / "w.bin").write_bytes(b"\0" * 128)
    cases["ext_offset_past_end"] = ext_offset_past_end
    cases["ext_missing_file"] = lambda d: _external(d, "missing.bin")
    cases["ext_directory"] = lambda d: (_external(d, "adir"), (d / "adir").mkdir())
    # external-data fields that Python's int() takes but onnx and onnxruntime refuse
    for label, value in (("spaces", " 128 "), ("plus", "+128"), ("underscore", "1_28"),
                         ("arabic_indic", "\u0661\u0662\u0668")):
        def loose(d, value=value):
            _external(d, "w.bin", length=None)
            m = onnx.load(d / "input.onnx", load_external_data=False)
            m.graph.initializer[0].external_data.add(key="length", value=value)
            (d / "w.bin").write_bytes(b"\0" * 128)
            _write(d, m)
        cases[f"external_length_{label}"] = loose

    def unknown_key(d):
        _external(d, "w.bin")
        m = onnx.load(d / "input.onnx", load_external_data=False)
        m.graph.initializer[0].external_data.add(key="frobnicate", value="1")
        (d / "w.bin").write_bytes(b"\0" * 128)
        _write(d, m)
    cases["external_unknown_key"] = unknown_key

    cases["unknown_opset_version"] = lambda d: _write(d, _model(
        [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], opsets=(("", 999),)))
    cases["unknown_op"] = lambda d: _write(d, _model(
        [helper.make_node("Frobnicate", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])]))
    cases["unknown_domain"] = lambda d: _write(d, _model(
        [helper.make_node("Op", ["x"], ["y"], domain="com.evil")], [_vi("x", [2])], [_vi("y", [2])],
        opsets=(("", 17), ("com.evil", 1))))
    cases["domain_not_imported"] = lambda d: _write(d, _model(
        [helper.make_node("Op", ["x"], ["y"], domain="com.evil")], [_vi("x", [2])], [_vi("y", [2])]))

    def missing_outer(d):
        then_g = helper.make_graph([helper.make_node("Neg", ["not_there"], ["t"])], "then", [], [_vi("t", [2])])
        else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [2])])
        _write(d, _model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                         [_vi("x", [2]), _vi("c", [], TensorProto.BOOL)], [_vi("y", [2])]))
    cases["subgraph_missing_outer_value"] = missing_outer

    def deep_subgraphs(d):
        # 500 nested If subgraphs, encoded by hand: deeper than protobuf itself will parse.
        def ld(field: int, payload: bytes) -> bytes:
            n, out = len(payload), bytearray()
            key = field << 3 | 2
            for v in (key, n):
                while True:
                    b, v = v & 0x7F, v >> 7
                    out.append(b | (0x80 if v else 0))
                    if not v:
                        break
            return bytes(out) + payload

        g = helper.make_graph([helper.make_node("Neg", ["x"], ["o"])], "leaf", [], [_vi("o", [2])]).SerializeToString()
        for _ in range(500):
            attr = ld(1, b"then_branch") + bytes([20 << 3, 5]) + ld(6, g)
            node = ld(1, b"c") + ld(2, b"o") + ld(4, b"If") + ld(5, attr)
            g = ld(1, node) + ld(2, b"g")
        head = _model([], [_vi("x", [2]), _vi("c", [], TensorProto.BOOL)], [_vi("o", [2])])
        head.graph.Clear()
        _write(d, head.SerializeToString() + ld(7, g))
    cases["deep_subgraphs"] = deep_subgraphs
    return cases


# -- MCP-IR cases ---------------------------------------------------------------------------------

def _mcpir_bytes() -> bytes:
    import tempfile

    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.mcpir import to_bytes

    m = good_model()
    m.graph.initializer.append(numpy_helper.from_array(np.ones(8, np.float32), "b"))
    m.graph.node.append(helper.make_node("Add", ["y", "b"], ["z"]))
    m.graph.output[0].name = "z"
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.onnx"
        p.write_bytes(m.SerializeToString())
        return to_bytes(load_onnx(p).model)


def _field(data: bytes, path: Callable, slot: int) -> int:
    from mcp_compiler.ir_schema import mcp_ir_generated as fb

    obj = path(fb.Model.GetRootAs(data[4:], 0))
    rel = obj._tab.Offset(4 + 2 * slot)
    return 4 + obj._tab.Pos + rel


def _patch(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def mcpir_cases() -> dict[str, Callable[[Path], None]]:
    data = _mcpir_bytes()
    second = lambda r: r.Graph().Initializers(1)  # noqa: E731  (offset field present: not 0)
    w = lambda d, b: _write(d, b, "input.mcpir")  # noqa: E731
    cases: dict[str, Callable[[Path], None]] = {
        "mcpir_wrong_identifier": lambda d: w(d, data[:8] + b"ONNX" + data[12:]),
        "mcpir_unknown_major": lambda d: w(d, _patch(data, _field(data, lambda r: r, 0), "<H", 7)),
        "mcpir_truncated_data": lambda d: w(d, data[: len(data) - 16]),
        "mcpir_truncated_header": lambda d: w(d, data[:40]),
        "mcpir_size_prefix_huge": lambda d: w(d, _patch(data, 0, "<I", 0xFFFFFFF0)),
        "mcpir_offset_out_of_file": lambda d: w(d, _patch(data, _field(data, second, 3), "<Q", 2**63)),
        "mcpir_length_out_of_file": lambda d: w(d, _patch(data, _field(data, second, 4), "<Q", 2**40)),
        "mcpir_overlapping_records": lambda d: w(d, _patch(data, _field(data, second, 3), "<Q", 0)),
        "mcpir_misaligned_record": lambda d: w(d, _patch(data, _field(data, second, 3), "<Q", 68)),
        "mcpir_bad_alignment": lambda d: w(d, _patch(data, _field(data, lambda r: r, 12), "<Q", 3)),
    }

    def vector_too_long(d):
        from mcp_compiler.ir_schema import mcp_ir_generated as fb

        g = fb.Model.GetRootAs(data[4:], 0).Graph()
        vec = g._tab.Vector(g._tab.Offset(6))
        w(d, _patch(data, 4 + vec - 4, "<I", 0x3FFFFFFF))
    cases["mcpir_vector_longer_than_buffer"] = vector_too_long

    def negative_offset(d):
        g = fb_root(data).Graph()
        pos = 4 + g._tab.Pos  # the table's soffset to its vtable
        w(d, _patch(data, pos, "<i", -(2**30)))
    cases["mcpir_vtable_outside"] = negative_offset

    def deep(d):
        from mcp_compiler.ir import Attribute, AttrType, Graph, Model, Node, Value
        from mcp_compiler.mcpir import to_bytes

        inner = Graph("leaf")
        for i in range(100):  # beyond the reader's limit of 64, within the writer's recursion
            outer = Graph(f"g{i}")
            c, o = Value(f"c{i}"), Value(f"o{i}")
            outer.inputs.append(c)
            outer.nodes.append(Node("If", [c], [o], attributes=[
                Attribute("then_branch", AttrType.GRAPH, inner), Attribute("else_branch", AttrType.GRAPH, Graph("e"))]))
            outer.outputs.append(o)
            inner = outer
        w(d, to_bytes(Model(inner, {"": 17})))
    cases["mcpir_deep_recursion"] = deep
    rng = np.random.default_rng(11)
    for i in range(6):
        def flip(d, seed=i):
            r = np.random.default_rng(seed)
            b = bytearray(data)
            for p in r.choice(len(b), 6, replace=False):
                if not 8 <= p < 12:
                    b[p] ^= int(r.integers(1, 256))
            w(d, bytes(b))
        cases[f"mcpir_bitflip_{i}"] = flip
    del rng
    return cases


def fb_root(data: bytes):
    from mcp_compiler.ir_schema import mcp_ir_generated as fb

    return fb.Model.GetRootAs(data[4:], 0)


# -- command-line cases ---------------------------------------------------------------------------
# Each writes what it needs into its folder d and returns the argument list after `mcp-cli`
# ("OUT" stands for the folder a command may write into: it must stay empty).

T = "triton-v1.12"


def _good(d: Path, m: onnx.ModelProto | None = None) -> str:
    _write(d, m or good_model())
    return str(d / "input.onnx")


def _config(d: Path, data: bytes) -> list[str]:
    src = _good(d)
    (d / "mcp.yaml").write_bytes(data)
    return ["convert", "--input", src, "--target", T, "--output", "OUT/repo", "--config", str(d / "mcp.yaml")]


def _symbolic_t() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", "T"])], [_vi("y", ["N", "T"])])


def cli_cases() -> dict[str, Callable[[Path], list[str]]]:
    def fifo_input(d):
        d.mkdir(parents=True, exist_ok=True)
        os.mkfifo(d / "input.onnx")   # a reader that opened it would block forever
        return ["convert", "--input", str(d / "input.onnx"), "--target", T, "--output", "OUT/repo"]

    def fifo_config(d):
        d.mkdir(parents=True, exist_ok=True)
        os.mkfifo(d / "mcp.yaml")
        return ["convert", "--input", _good(d), "--target", T, "--output", "OUT/repo", "--config", str(d / "mcp.yaml")]

    def fifo_manifest(d):
        d.mkdir(parents=True, exist_ok=True)
        os.mkfifo(d / "zoo.yaml")
        return ["zoo", str(d / "zoo.yaml"), "--output", "OUT/repo", "--cache", "OUT/cache"]

    def dev_zero_config(d):
        return ["convert", "--input", _good(d), "--target", T, "--output", "OUT/repo", "--config", "/dev/zero"]

    def output_empty(d):
        return ["convert", "--input", _good(d), "--target", T, "--output", ""]

    def output_under_file(d):
        src = _good(d)
        return ["convert", "--input", src, "--target", T, "--output", f"{src}/repo"]

    def mcpir_under_file(d):
        src = _good(d)
        return ["convert", "--input", src, "--output", f"{src}/m.mcpir"]

    def report_under_proc(d):
        return ["convert", "--input", _good(d), "--target", T, "--output", "OUT/repo", "--report", "/proc/mcp.json"]

    def existing_mcpir(d):
        src = _good(d)
        (d / "m.mcpir").write_bytes(b"keep me")
        return ["convert", "--input", src, "--output", str(d / "m.mcpir")]

    def huge_static_dim(d):
        m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1, 2**40])], [_vi("y", [1, 2**40])])
        return ["convert", "--input", _good(d, m), "--target", T, "--output", "OUT/repo", "--verify"]

    def huge_warmup(d):
        return ["convert", "--input", _good(d, _symbolic_t()), "--target", T, "--output", "OUT/repo",
                "--warmup", "--warmup-dims", "T=2147483647"]

    return {
        "fifo_input": fifo_input, "fifo_config": fifo_config, "fifo_manifest": fifo_manifest,
        "dev_zero_config": dev_zero_config,
        "config_too_big": lambda d: _config(d, b"# padding\n" * 200_000),
        "config_deep_nesting": lambda d: _config(d, b"max_batch_size: " + b"[" * 20_000),
        "config_not_utf8": lambda d: _config(d, b"max_batch_size: 4\nkind: \xff\xfe\n"),
        "config_nul_byte": lambda d: _config(d, b"max_batch_size: 4\n\0\n"),
        "config_int_overflow": lambda d: _config(d, b"max_batch_size: 99999999999999999999\n"),
        "dims_unicode_digit": lambda d: ["convert", "--input", _good(d), "--target", T, "--output", "OUT/repo",
                                         "--verify", "--dims", "N=\u00b2"],
        "dims_too_big": lambda d: ["convert", "--input", _good(d), "--target", T, "--output", "OUT/repo",
                                   "--verify", "--dims", "N=99999999999999999999"],
        "dims_unknown_symbol": lambda d: ["convert", "--input", _good(d), "--target", T, "--output", "OUT/repo",
                                          "--verify", "--dims", "NN=2"],
        "dims_without_verify": lambda d: ["convert", "--input", _good(d), "--target", T, "--output", "OUT/repo",
                                          "--dims", "N=2"],
        "huge_static_dim_verify": huge_static_dim, "huge_warmup_dims": huge_warmup,
        "output_empty": output_empty, "output_under_file": output_under_file,
        "output_under_proc": lambda d: ["convert", "--input", _good(d), "--target", T, "--output", "/proc/mcp-repo"],
        "mcpir_under_file": mcpir_under_file, "report_under_proc": report_under_proc,
        "existing_mcpir_without_force": existing_mcpir,
        "opset_below_the_model": lambda d: ["convert", "--input", _good(d), "--target", T, "--output", "OUT/repo",
                                            "--opset", "11"],
        "disable_pass_without_pipeline": lambda d: ["convert", "--input", _good(d), "--output", "OUT/m.mcpir",
                                                    "--disable-pass", "fold-constants"],
    }


def build_cli(out: Path) -> dict[str, list[str]]:
    """Write every command-line case under `out`; returns case name -> its arguments."""
    made = {}
    for name, make in cli_cases().items():
        (out / name).mkdir(parents=True)
        made[name] = make(out / name)
    return made


def build(out: Path) -> dict[str, Path]:
    """Write every case under `out`; returns case name -> the file to convert."""
    made = {}
    for name, make in {**onnx_cases(), **mcpir_cases()}.items():
        d = out / name
        make(d)
        made[name] = next(p for p in (d / "input.onnx", d / "input.mcpir") if p.exists())
    return made


if __name__ == "__main__":
    for name in build(Path(sys.argv[1])):
        print(name)
