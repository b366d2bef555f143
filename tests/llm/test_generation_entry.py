"""A decoder LLM converted for Triton is a decoupled generation entry: its config (text in, a
response a token out), the pool flags, --no-generation, `generate` in-process, and the pod sizing
of `deploy --kserve` (weights plus the pool)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from _tiny import write_tiny_gguf

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def _cli(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gen") / "tiny.gguf")


def _config(entry):
    from mcp_compiler.targets.triton.entry import read_config

    return read_config(entry)


def test_a_decoder_becomes_a_decoupled_generation_entry(tiny, tmp_path):
    r = _cli("convert", str(tiny), "-t", "triton-v1.12", "-o", str(tmp_path), "--name", "g", "--kv-cache-bytes",
             "64MiB", "--kv-block-size", "8", "--max-concurrent-requests", "3", "--no-prefix-caching", "--max-queue", "5")
    assert r.returncode == 0, r.stderr
    cfg = _config(tmp_path / "g")
    assert cfg.model_transaction_policy.decoupled and cfg.max_batch_size == 0
    assert [i.name for i in cfg.input] == ["text_input", "messages", "input_ids", "sampling_parameters"]
    assert all(i.optional for i in cfg.input)
    assert [o.name for o in cfg.output] == ["text_output", "token_ids", "finish_reason", "usage"]
    gen = json.loads(cfg.parameters["mcp_generation"].string_value)
    assert gen["kv_cache_bytes"] == 64 << 20 and gen["block_size"] == 8 and gen["max_running"] == 3
    assert gen["prefix_caching"] is False and gen["max_queue"] == 5
    assert (tmp_path / "g" / "1" / "mcp_runtime" / "engine.py").is_file()
    assert "decoupled" in (tmp_path / "g" / "1" / "model.py").read_text()   # the generation model file
    raw = _cli("convert", str(tiny), "-t", "triton-v1.12", "-o", str(tmp_path), "--name", "raw", "--no-generation")
    assert raw.returncode == 0, raw.stderr
    assert "past_key_values.0.key" in [i.name for i in _config(tmp_path / "raw").input]


@pytest.mark.parametrize("flags, expect", [(["--kv-cache-bytes", "lots"], "--kv-cache-bytes"),
                                           (["--kv-cache-bytes", "0"], "--kv-cache-bytes"),
                                           (["--kv-block-size", "0"], "--kv-block-size"),
                                           (["--generation", "--backend", "onnxruntime"], "python backend")])
def test_bad_generation_flags_one_error_line(tiny, tmp_path, flags, expect):
    r = _cli("convert", str(tiny), "-t", "triton-v1.12", "-o", str(tmp_path / "o"), *flags)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and expect in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


def test_generate_in_process_streams_what_greedy_gives(tiny, tmp_path):
    from mcp_compiler.frontend.gguf import gguf_decoder
    from mcp_compiler.llm.verify import OrtRunner
    from mcp_compiler.targets.triton.runtime.decoder import Decoder, greedy
    from mcp_compiler.targets.triton.runtime.text import ChatTokenizer, TokenizerInfo

    assert _cli("convert", str(tiny), "-t", "triton-v1.12", "-o", str(tmp_path), "--name", "g").returncode == 0
    r = _cli("generate", str(tmp_path / "g"), "hello", "--max-tokens", "6", "--ignore-eos", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    proto = gguf_decoder(tiny, last_logits=True)
    dec = Decoder(OrtRunner(proto.SerializeToString()))
    tok = ChatTokenizer(TokenizerInfo.from_metadata({p.key: p.value for p in proto.metadata_props}))
    assert out["token_ids"] == greedy(dec, tok.encode("hello"), 6) and out["finish_reason"] == "length"
    bad = _cli("generate", str(tmp_path / "g"), "hello", "--max-tokens", "0")
    assert bad.returncode == 2 and "max_tokens" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("kserve", "kubernetes", "kubernetes_validate")),
                    reason="the kube extra is not installed")
def test_kserve_pod_memory_covers_weights_and_pool(tiny, tmp_path):
    k8s = ["--storage-uri", "s3://models/repo", "--image", "registry.example/mcp-triton:24.10-ort"]
    assert _cli("convert", str(tiny), "-t", "triton-v1.12", "-o", str(tmp_path), "--name", "auto").returncode == 0
    r = _cli("deploy", str(tmp_path / "auto"), "--kserve", "-o", str(tmp_path / "k1"), *k8s)
    assert r.returncode == 2 and "--kv-cache-bytes" in r.stderr     # a share of the node's memory: refused
    assert _cli("convert", str(tiny), "-t", "triton-v1.12", "-o", str(tmp_path), "--name", "g",
                "--kv-cache-bytes", "512MiB").returncode == 0
    r = _cli("deploy", str(tmp_path / "g"), "--kserve", "-o", str(tmp_path / "k2"), *k8s, "--json")
    assert r.returncode == 0, r.stderr
    text = "\n".join(p.read_text() for p in (tmp_path / "k2").rglob("*.yaml"))
    mem = [int(m) for m in __import__("re").findall(r"memory: '?(\d+)Mi", text)]
    assert mem and min(mem) >= 512
    # the tokens stream over gRPC: the InferenceService routes Triton's gRPC port (h2c), and its
    # readiness asks the model's READY on the pod's HTTP port
    import yaml

    model = yaml.safe_load((tmp_path / "k2" / "inferenceservice.yaml").read_text())["spec"]["predictor"]["model"]
    assert model["ports"] == [{"name": "h2c", "containerPort": 9000, "protocol": "TCP"}]
    assert "--grpc-port=9000" in model["args"] and "--http-port=8080" in model["args"]
    code = model["readinessProbe"]["exec"]["command"][2]
    assert "/v2/models/g/ready" in code and any("streams its tokens" in n for n in json.loads(r.stdout)["notes"])
    _probe_answers(code)


def _probe_answers(code: str) -> None:
    """The probe's own code, pointed at a local server: exit 0 on 200, 1 on 400 or nothing there."""
    import http.server
    import socket
    import subprocess
    import sys
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        status = 200

        def do_GET(self):
            self.send_response(H.status)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        local = code.replace("127.0.0.1:8080", f"127.0.0.1:{srv.server_port}")
        assert subprocess.run([sys.executable, "-c", local]).returncode == 0
        H.status = 400
        assert subprocess.run([sys.executable, "-c", local]).returncode == 1
    finally:
        srv.shutdown()
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:8080", f"127.0.0.1:{free}")]).returncode == 1


def test_a_pool_of_a_given_size_is_held_from_the_load_on():
    """Measured in a process of its own: a test worker's other threads allocate beside it (a lazy
    pool's RSS grew 8.8 MB there once, none of it the pool's)."""
    code = """
import sys
from mcp_compiler.targets.triton.runtime.engine import SlotPool

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

before = rss()
lazy = SlotPool(2, 2048, 16, 4, 2, 64)   # 2 slots x 2048 tokens x 4 layers x (k, v) x 2 heads x 64 x 4 B: 16 MiB
lazy_grew = rss() - before
before = rss()
held = SlotPool(2, 2048, 16, 4, 2, 64, commit=True)
print(lazy.nbytes, lazy_grew, held.nbytes, rss() - before)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lazy_bytes, lazy_grew, held_bytes, held_grew = map(int, r.stdout.split())
    assert lazy_bytes == held_bytes == 16 << 20
    assert lazy_grew < 4 << 20 and held_grew >= 15 << 20, r.stdout


def test_onnx_decoders_packed_become_generation_entries_plain_ones_their_raw_step(tiny, tmp_path):
    import onnx

    from mcp_compiler.frontend.gguf import gguf_decoder
    from mcp_compiler.llm.verify import OrtRunner
    from mcp_compiler.targets.triton.runtime.decoder import Decoder, greedy

    # a packed ONNX decoder with every position's logits (as onnxruntime-genai's): served by the engine
    assert _cli("convert", str(tiny), "-o", str(tmp_path / "packed.onnx")).returncode == 0
    r = _cli("convert", str(tmp_path / "packed.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path), "--name", "p")
    assert r.returncode == 0, r.stderr
    assert "mcp_generation" in _config(tmp_path / "p").parameters
    out = json.loads(_cli("generate", str(tmp_path / "p"), "hello", "--max-tokens", "5", "--ignore-eos",
                          "--json").stdout)
    proto = gguf_decoder(tiny, last_logits=True)
    from mcp_compiler.targets.triton.runtime.text import ChatTokenizer, TokenizerInfo

    tok = ChatTokenizer(TokenizerInfo.from_metadata({p.key: p.value for p in proto.metadata_props}))
    assert out["token_ids"] == greedy(Decoder(OrtRunner(proto.SerializeToString())), tok.encode("hello"), 5)
    # Optimum's plain export (present = past + new): its raw step, said so; --generation refused
    plain = gguf_decoder(tiny, last_logits=False, fused=False)
    onnx.save(plain, str(tmp_path / "plain.onnx"))
    r = _cli("convert", str(tmp_path / "plain.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path), "--name", "o")
    assert r.returncode == 0 and "raw step" in r.stderr, r.stderr
    assert "mcp_generation" not in _config(tmp_path / "o").parameters
    r = _cli("convert", str(tmp_path / "plain.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path / "x"), "--generation")
    assert r.returncode == 2 and "GroupQueryAttention" in r.stderr and len(r.stderr.strip().splitlines()) == 1
