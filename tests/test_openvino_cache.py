"""Hardening round 5 (issue 62): what OpenVINO keeps of an entry is what was checked.

An OpenVINO entry keeps the model as rewritten for OpenVINO and its compiled blobs in a cache
(`1/ov_cache`, or a private folder of the user's when the entry cannot be written). Before the
fix a later load read whatever model or blob it found there, named by the .mcpir's path, size
and date: a planted graph was served READY and `verify` (which ran the .mcpir without the cache)
passed. Now each kept file is named by the content it came from and checked against its digest
before use (a mismatch is a miss, made again), `verify` runs through the server's cache, and the
fallback folder is used only while it is a private folder of this user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from _helpers import GOLDEN

pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
CONVNET = GOLDEN / "convnet" / "model.onnx"


def _cli(*args, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def ov_entry(tmp_path_factory):
    d = tmp_path_factory.mktemp("ov")
    r = _cli("convert", str(CONVNET), "-t", "triton-v1.12", "-o", str(d), "--name", "m", "--runtime", "openvino")
    assert r.returncode == 0, r.stderr
    return d / "m"


@pytest.fixture()
def entry(ov_entry, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(ov_entry, copy)
    shutil.rmtree(copy / "1" / "ov_cache", ignore_errors=True)
    return copy


def _load(vdir, cache):
    from mcp_compiler.targets.triton.verify import load_runtime

    rt = load_runtime(vdir)
    return rt.MCPIRModel(vdir / "model.mcpir", engine="openvino", precision="f32", cache_dir=str(cache))


X = np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32)


def _spoil(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _sha(path):
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_changed_saved_model_is_a_cache_miss_made_again(entry):
    vdir = entry / "1"
    cache = vdir / "ov_cache"
    cache.mkdir()
    first = _load(vdir, cache)
    want = first.run({first.input_names[0]: X})[0]
    xml = next(cache.glob("model-*.xml"))
    _spoil(xml.with_suffix(".bin"))   # a saved model changed after it was saved
    again = _load(vdir, cache)
    assert again.ov_rewrites is not None   # not read as saved: lowered again
    np.testing.assert_array_equal(again.run({again.input_names[0]: X})[0], want)
    third = _load(vdir, cache)   # ... and saved again, intact: read as saved
    assert third.ov_rewrites is None
    np.testing.assert_array_equal(third.run({third.input_names[0]: X})[0], want)


def test_a_changed_or_unsigned_compiled_blob_is_removed_and_compiled_again(entry):
    vdir = entry / "1"
    cache = vdir / "ov_cache"
    cache.mkdir()
    first = _load(vdir, cache)
    want = first.run({first.input_names[0]: X})[0]
    (blob,) = (cache / "f32").glob("*.blob")
    assert (cache / "f32" / (blob.name + ".sha256")).read_text().strip() == _sha(blob)
    blob.write_bytes(blob.read_bytes()[:-64] + b"\0" * 64)
    planted = cache / "f32" / "123.blob"
    planted.write_bytes(b"not OpenVINO's")
    again = _load(vdir, cache)
    np.testing.assert_array_equal(again.run({again.input_names[0]: X})[0], want)
    assert not planted.exists()
    (blob,) = (cache / "f32").glob("*.blob")
    assert (cache / "f32" / (blob.name + ".sha256")).read_text().strip() == _sha(blob)


def test_the_saved_model_is_named_by_the_content_not_the_files_path_size_or_date(entry, tmp_path):
    """Another .mcpir put at the same path with the same size and modification time (the old
    key) is not served the first one's saved model."""
    vdir = entry / "1"
    cache = vdir / "ov_cache"
    cache.mkdir()
    mcpir = vdir / "model.mcpir"
    first = _load(vdir, cache)
    want = first.run({first.input_names[0]: X})[0]
    st = mcpir.stat()
    data = bytearray(mcpir.read_bytes())
    tail = np.frombuffer(data, dtype=np.uint8, count=len(data) // 4 * 4).copy().view(np.float32)
    # the last weights (the data section ends the file) negated: a different model, same size
    n = 64
    tail[-n:] *= -1.0
    data[len(data) // 4 * 4 - 4 * n: len(data) // 4 * 4] = tail[-n:].tobytes()
    mcpir.write_bytes(bytes(data))
    os.utime(mcpir, ns=(st.st_atime_ns, st.st_mtime_ns))
    other = _load(vdir, cache)
    assert other.ov_rewrites is not None   # a model of its own, not the first one's
    assert len(list(cache.glob("model-*.xml"))) == 2
    assert not np.array_equal(other.run({other.input_names[0]: X})[0], want)


@pytest.fixture(scope="module")
def other_saved(tmp_path_factory):
    """The saved OpenVINO model (xml, bin) of another model with the same interface: the
    convnet with its weights negated."""
    import onnx
    from onnx import numpy_helper

    d = tmp_path_factory.mktemp("other")
    m = onnx.load(CONVNET)
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32 and a.ndim == 4:
            init.CopyFrom(numpy_helper.from_array(-a, init.name))
    onnx.save(m, d / "other.onnx")
    r = _cli("convert", str(d / "other.onnx"), "-t", "triton-v1.12", "-o", str(d), "--name", "o",
             "--runtime", "openvino")
    assert r.returncode == 0, r.stderr
    r = _cli("verify", str(d / "other.onnx"), str(d / "o"))   # as served: its cache made
    assert r.returncode == 0, r.stderr
    xml = next((d / "o" / "1" / "ov_cache").glob("model-*.xml"))
    return xml, xml.with_suffix(".bin")


def test_verify_of_an_openvino_entry_runs_what_the_server_runs(entry, other_saved):
    """Another graph put in place of the saved model, its digests written too (by someone who
    can write the entry): that is what the server would run, and verify, running the same
    cache, fails; without new digests it is a miss (the entry's own model is made again)."""
    r = _cli("verify", str(CONVNET), str(entry))
    assert r.returncode == 0, r.stderr
    cache = entry / "1" / "ov_cache"
    xml = next(cache.glob("model-*.xml"))
    bin_ = xml.with_suffix(".bin")

    def plant():
        shutil.copyfile(other_saved[0], xml)
        shutil.copyfile(other_saved[1], bin_)
        for blob in cache.glob("*/*.blob"):
            os.unlink(blob)

    plant()
    r = _cli("verify", str(CONVNET), str(entry))   # the digests do not match: made again
    assert r.returncode == 0, r.stderr
    plant()
    xml.with_suffix(".sha256").write_text(f"{_sha(xml)} {_sha(bin_)}\n")
    r = _cli("verify", str(CONVNET), str(entry))
    assert r.returncode == 1 and "FAIL" in r.stdout.upper(), r.stdout + r.stderr
    shutil.rmtree(cache)
    r = _cli("verify", str(CONVNET), str(entry))
    assert r.returncode == 0, r.stderr


def _cache_for(vdir, tmp):
    from mcp_compiler.targets.triton.verify import load_runtime

    rt = load_runtime(vdir)
    old = os.environ.get("TMPDIR")
    import tempfile

    os.environ["TMPDIR"] = str(tmp)
    tempfile.tempdir = None
    try:
        return rt.cache_dir_for(vdir / "model.mcpir")
    finally:
        if old is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = old
        tempfile.tempdir = None


def test_the_cache_is_beside_the_entry_and_never_through_a_link(entry, tmp_path):
    vdir = entry / "1"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    assert _cache_for(vdir, tmp) == str(vdir / "ov_cache")
    os.rmdir(vdir / "ov_cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, vdir / "ov_cache")   # a link: not followed, the private folder instead
    private = tmp / f"mcp-ov-cache-{os.getuid()}"
    assert _cache_for(vdir, tmp) == str(private)
    assert private.is_dir() and (private.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("planted", ["open", "link", "other_owner", "file"])
def test_a_fallback_folder_someone_else_could_write_is_not_used(entry, tmp_path, planted):
    """The fallback folder's name can be computed by anyone: one that is not a private folder of
    this user (mode open to others, a link, another owner, not a folder) turns the cache off."""
    vdir = entry / "1"
    os.symlink(tmp_path, vdir / "ov_cache")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    private = tmp / f"mcp-ov-cache-{os.getuid()}"
    if planted == "open":
        private.mkdir()
        private.chmod(0o777)
    elif planted == "link":
        (tmp_path / "theirs").mkdir(mode=0o700)
        os.symlink(tmp_path / "theirs", private)
    elif planted == "other_owner":
        if os.getuid() != 0:
            pytest.skip("giving a folder to another user needs root")
        private.mkdir(mode=0o700)
        os.chown(private, 4242, 4242)
    else:
        private.write_text("")
    assert _cache_for(vdir, tmp) is None


def test_an_entry_loads_without_a_cache_when_none_is_safe(entry):
    vdir = entry / "1"
    from mcp_compiler.targets.triton.verify import load_runtime

    rt = load_runtime(vdir)
    m = rt.MCPIRModel(vdir / "model.mcpir", engine="openvino", precision="f32", cache_dir=None)
    assert m.run({m.input_names[0]: X})[0].shape[0] == 2
    assert not (vdir / "ov_cache").exists()


def test_deploy_leaves_the_cache_out_of_the_upload_and_the_content_hash(entry):
    from mcp_compiler.targets.triton.entry import read_files

    vdir = entry / "1"
    before = read_files(vdir, 1 << 30, version=1)
    _load(vdir, vdir / "ov_cache")
    assert any((vdir / "ov_cache").rglob("*.blob"))
    after = read_files(vdir, 1 << 30, version=1)
    assert after == before and not any("ov_cache" in k for k in after)


def test_no_openvino_telemetry_in_convert_verify_or_the_runtime(tmp_path):
    """Importing all of openvino writes ~/intel/openvino_ga_cid and ~/intel/stats and forks a
    child that looks up its analytics host; none of our processes may: with HOME in a temp
    folder, convert, verify and a load leave it empty, and openvino_telemetry never loads."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    env.pop("CI", None)   # (openvino_telemetry stays quiet in CI: the test must not depend on it)
    r = _cli("convert", str(CONVNET), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--name", "m",
             "--runtime", "openvino", env=env)
    assert r.returncode == 0, r.stderr
    r = _cli("verify", str(CONVNET), str(tmp_path / "repo" / "m"), env=env)
    assert r.returncode == 0, r.stderr
    code = ("import sys, numpy as np\n"
            "from mcp_compiler.targets.triton.verify import load_runtime\n"
            "from pathlib import Path\n"
            "v = Path(sys.argv[1]); rt = load_runtime(v)\n"
            "m = rt.MCPIRModel(v / 'model.mcpir', engine='openvino', precision='f32', cache_dir=rt.cache_dir_for(v / 'model.mcpir'))\n"
            "import openvino.tools.ovc\n"   # even the converter, imported later, runs without it
            "print(sys.modules.get('openvino_telemetry'))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "repo" / "m" / "1")], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr
    # onnxruntime 1.32 writes its own settings there on import (docs/reliability.md), no socket
    onnxruntime = home / ".cache" / "Microsoft" / "DeveloperTools" / ".onnxruntime"
    assert [p for p in home.rglob("*") if p not in onnxruntime.parents and onnxruntime not in (p, *p.parents)] == []


def test_convert_and_verify_of_an_openvino_entry_open_no_network_socket(tmp_path):
    """The telemetry's child looked up its analytics host by DNS (a UDP socket to port 53):
    convert and verify of an OpenVINO entry open no internet socket at all (strace)."""
    import shutil as sh

    if sh.which("strace") is None:
        pytest.skip("strace is not installed (apt install strace)")
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("CI", None)
    for i, args in enumerate([("convert", str(CONVNET), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                               "--name", "m", "--runtime", "openvino"),
                              ("verify", str(CONVNET), str(tmp_path / "repo" / "m"))]):
        trace = tmp_path / f"trace{i}"
        r = subprocess.run(["strace", "-f", "-e", "trace=socket", "-o", str(trace), *CLI, *args],
                           capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr
        inet = [line for line in trace.read_text().splitlines() if "AF_INET" in line]
        assert inet == [], inet


@pytest.mark.parametrize("where", ["saved", "blob"])
def test_a_folder_or_link_where_a_kept_file_goes_is_a_miss_not_a_failure(entry, tmp_path, where):
    vdir = entry / "1"
    cache = vdir / "ov_cache"
    cache.mkdir()
    first = _load(vdir, cache)
    want = first.run({first.input_names[0]: X})[0]
    (path,) = cache.glob("model-*.xml") if where == "saved" else (cache / "f32").glob("*.blob")
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")
    again = _load(vdir, cache)
    np.testing.assert_array_equal(again.run({again.input_names[0]: X})[0], want)
    assert path.is_file()   # made again in its place
    path.unlink()
    os.symlink(tmp_path / "elsewhere", path)
    third = _load(vdir, cache)
    np.testing.assert_array_equal(third.run({third.input_names[0]: X})[0], want)
    assert not (tmp_path / "elsewhere").exists()   # nothing written through the link
