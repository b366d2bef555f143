"""The CLI's edges: file modes, full disks, read-only folders, models onnxruntime refuses, layout
and output contracts, onnxruntime's own log lines, flags that would do nothing."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from _helpers import GOLDEN, save_model
from onnx import TensorProto, helper, numpy_helper

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
T = "triton-v1.12"
MLP = GOLDEN / "mlp" / "model.onnx"
F = TensorProto.FLOAT


def _cli(*args: str, umask: int | None = None, cwd: Path | None = None):
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([*CLI, *args], capture_output=True, text=True, preexec_fn=pre, cwd=cwd)


_save = save_model


def _one_error(r, code: int, *expect: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for e in expect:
        assert e in lines[0], lines[0]


def _modes(root: Path) -> set[tuple[str, int]]:
    return {("d" if p.is_dir() else "f", stat.S_IMODE(p.stat().st_mode)) for p in [root, *root.rglob("*")]
            if "__pycache__" not in p.parts}


# -- 1: written files follow the umask --------------------------------------------------------------

@pytest.mark.parametrize("umask, fmode, dmode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_written_files_follow_the_umask(tmp_path, umask, fmode, dmode):
    assert _cli("convert", "-i", str(MLP), "-t", T, "-o", str(tmp_path / "repo"), "--name", "mlp",
                umask=umask).returncode == 0
    assert _modes(tmp_path / "repo" / "mlp") == {("f", fmode), ("d", dmode)}
    assert _cli("convert", "-i", str(MLP), "-o", str(tmp_path / "m.mcpir"), umask=umask).returncode == 0
    assert stat.S_IMODE((tmp_path / "m.mcpir").stat().st_mode) == fmode
    man = tmp_path / "zoo.yaml"
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mlp.onnx").write_bytes(MLP.read_bytes())
    man.write_text("models:\n  - name: mlp\n    source: {path: models/mlp.onnx}\n")
    r = _cli("zoo", str(man), "-o", str(tmp_path / "zrepo"), "--cache", str(tmp_path / "cache"), umask=umask)
    assert r.returncode == 0, r.stderr
    assert _modes(tmp_path / "zrepo" / "mlp") == {("f", fmode), ("d", dmode)}
    entries = [p for p in (tmp_path / "cache" / "entries").iterdir() if p.is_dir()]
    assert {m for e in entries for m in _modes(e)} == {("f", fmode), ("d", dmode)}


# -- 6: output paths, read-only folders and full disks ------------------------------------------------

@contextlib.contextmanager
def _tmpfs(where: Path, options: str):
    """A small tmpfs mounted at `where` (root only: skips otherwise)."""
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_read_only_folder_is_refused_before_any_work(tmp_path):
    with _tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        r = _cli("convert", "-i", str(MLP), "-t", T, "-o", str(ro / "repo"))
        _one_error(r, 2, "--output", "is not writable")
        r = _cli("convert", "-i", str(MLP), "-t", T, "-o", str(tmp_path / "repo"), "--report", str(ro / "r.json"))
        _one_error(r, 2, "--report", "is not writable")
        assert not (tmp_path / "repo").exists()  # checked before the model was converted


@pytest.mark.parametrize("kind", ["repository", "mcpir"])
def test_full_disk_is_one_error_and_leaves_nothing(tmp_path, kind):
    # 64 KiB of room: the runtime package alone is larger, the MLP's .mcpir too once padded
    big = _save(tmp_path, "big", [helper.make_node("MatMul", ["x", "W"], ["y"])],
                [helper.make_tensor_value_info("x", F, ["N", 256])], [helper.make_tensor_value_info("y", F, ["N", 256])],
                [numpy_helper.from_array(np.ones((256, 256), np.float32), "W")])
    with _tmpfs(tmp_path / "small", "size=64k") as small:
        out = small / ("repo" if kind == "repository" else "m.mcpir")
        args = ["-t", T] if kind == "repository" else []
        r = _cli("convert", "-i", str(big), *args, "-o", str(out))
        _one_error(r, 1, str(out.name), "no space left on the device")
        assert list(small.iterdir()) == []   # no OUT/, no .OUT.mcp-staging/, no temp file


# -- 9: convert --verify that fails leaves no entry -------------------------------------------------------

def test_failed_verify_leaves_no_entry(tmp_path):
    # inputs on which the original itself gives only NaN: nothing can be compared, verify fails
    nan = tmp_path / "nan.npz"
    np.savez(nan, x=np.full((2, 16), np.nan, np.float32))
    r = _cli("convert", "-i", str(MLP), "-t", T, "-o", str(tmp_path / "repo"), "--verify", "--inputs", str(nan))
    _one_error(r, 1, "gives only NaN/Inf")
    assert not (tmp_path / "repo").exists() and not (tmp_path / ".repo.mcp-staging").exists()


# -- 10: onnxruntime's own log lines never reach the user ------------------------------------------------

def test_no_onnxruntime_warnings_in_verify(tmp_path):
    # initializers listed as graph inputs make onnxruntime warn once per initializer
    ws = [numpy_helper.from_array(np.full((4, 4), 0.1, np.float32), f"w{i}") for i in range(3)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"]) for i in range(3)]
    inputs = [helper.make_tensor_value_info("x", F, ["N", 4])] + [
        helper.make_tensor_value_info(f"w{i}", F, [4, 4]) for i in range(3)]
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("h2", F, ["N", 4])], ws),
                          opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 4
    src = tmp_path / "m.onnx"
    onnx.save(m, src)
    r = _cli("convert", "-i", str(src), "-t", T, "-o", str(tmp_path / "repo"), "--verify")
    assert r.returncode == 0, r.stderr
    r = _cli("verify", "-i", str(src), "-r", str(tmp_path / "repo" / "m"))
    assert r.returncode == 0 and "onnxruntime" not in r.stderr and r.stderr == "", r.stderr


# -- 14: the emitted model must load -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
def test_models_onnxruntime_refuses_are_not_reported_done(tmp_path, backend):
    # Sqrt has no int32 kernel; MatMul of [N, 4] by a [5, 3] weight contradicts its declared dims
    sqrt = _save(tmp_path, "sqrt", [helper.make_node("Sqrt", ["x"], ["y"])],
                 [helper.make_tensor_value_info("x", TensorProto.INT32, ["N", 4])],
                 [helper.make_tensor_value_info("y", TensorProto.INT32, ["N", 4])])
    mm = _save(tmp_path, "mm", [helper.make_node("MatMul", ["x", "W"], ["y"])],
               [helper.make_tensor_value_info("x", F, ["N", 4])], [helper.make_tensor_value_info("y", F, ["N", 3])],
               [numpy_helper.from_array(np.ones((5, 3), np.float32), "W")])
    for src, why in ((sqrt, "Sqrt"), (mm, "MatMul")):
        r = _cli("convert", "-i", str(src), "-t", T, "-o", str(tmp_path / "repo"), "--backend", backend)
        _one_error(r, 1, "does not load", why, "--no-load-check")
        assert not (tmp_path / "repo").exists()
    r = _cli("convert", "-i", str(mm), "-t", T, "-o", str(tmp_path / "repo"), "--backend", backend, "--no-load-check")
    assert r.returncode == 0 and (tmp_path / "repo" / "mm" / "config.pbtxt").exists()


# -- 15, 16: layout and output contracts ---------------------------------------------------------------

def test_nhwc_verify_on_a_model_whose_input_is_nhwc_already(tmp_path):
    w = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32)
    src = _save(tmp_path, "nhwc", [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
                                   helper.make_node("Conv", ["xt", "w"], ["c"], pads=[1, 1, 1, 1]),
                                   helper.make_node("Relu", ["c"], ["y"])],
                [helper.make_tensor_value_info("x", F, ["N", 16, 16, 3])],
                [helper.make_tensor_value_info("y", F, ["N", 8, 16, 16])], [numpy_helper.from_array(w, "w")])
    r = _cli("convert", "-i", str(src), "-t", T, "-o", str(tmp_path / "repo"), "--layout", "nhwc", "--verify")
    assert r.returncode == 0, r.stderr
    assert "y: max abs 0" in r.stdout


def test_output_contract_is_what_the_model_returns(tmp_path):
    # y is declared [N, 4] but Unsqueeze makes [N, 4, 1]: config.pbtxt says what is served
    src = _save(tmp_path, "unsq", [helper.make_node("Unsqueeze", ["x", "ax"], ["y"])],
                [helper.make_tensor_value_info("x", F, ["N", 4])], [helper.make_tensor_value_info("y", F, ["N", 4])],
                [numpy_helper.from_array(np.array([2], np.int64), "ax")])
    r = _cli("convert", "-i", str(src), "-t", T, "-o", str(tmp_path / "repo"), "--verify", "--json")
    assert r.returncode == 0, r.stderr
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = text_format.Parse((tmp_path / "repo" / "unsq" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert list(cfg.output[0].dims) == [4, 1]
    import json

    warnings = json.loads(r.stdout)["warnings"]
    assert [w for w in warnings if "the output contract uses the inferred shape" in w] == [
        "shape conflict: 'y': rank 3 inferred, 2 declared; the output contract uses the inferred shape"]


# -- 17: --quantize that quantizes nothing changes nothing -------------------------------------------------

def test_fp8_that_quantizes_nothing_leaves_the_model_alone(tmp_path):
    src = tmp_path / "mlp.onnx"
    src.write_bytes(MLP.read_bytes())
    plain = _cli("convert", "-i", str(src), "-t", T, "-o", str(tmp_path / "a"), "--json")
    quant = _cli("convert", "-i", str(src), "-t", T, "-o", str(tmp_path / "b"), "--json", "--quantize", "fp8",
                 "--quantize-min-elements", "100000000")
    assert plain.returncode == 0 and quant.returncode == 0, quant.stderr
    import json

    q = json.loads(quant.stdout)
    assert any("nothing to quantize" in w for w in q["warnings"])
    assert not any(p["name"] == "upgrade-opset" for p in q["passes"])
    assert (tmp_path / "a" / "mlp" / "1" / "model.mcpir").read_bytes() == \
        (tmp_path / "b" / "mlp" / "1" / "model.mcpir").read_bytes()
