"""A stateful model served with its state on the server (Triton's sequence batcher, the runtime's
state table), on the real local tritonserver: the zoo's FSMN VAD (four caches in and out). A client
streaming frames with a sequence ID and only the non-state input gets, frame by frame, what
onnxruntime gives with the state threaded by hand, with two streams interleaved; END frees the
slot; an idle sequence expires; deploy and bench handle sequences."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from _helpers import zoo_model

pytestmark = pytest.mark.slow  # a real Triton

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver")

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def _cli(*args: str, env=None):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def fsmn():
    return zoo_model("fsmn_vad")


def _threaded(src, frames):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    state = {f"in_cache{i}": np.zeros((1, 128, 19, 1), np.float32) for i in range(4)}
    outs = []
    for f in frames:
        r = sess.run(None, {"speech": f, **state})
        outs.append(r[0])
        state = {f"in_cache{i}": r[1 + i] for i in range(4)}
    return outs


def test_stateful_entry_streams_match_onnxruntime(fsmn, tmp_path):
    import tritonclient.grpc as tg

    from mcp_compiler.targets.triton.serve import TritonServer

    r = _cli("inspect", str(fsmn), "--json")
    assert [(p["input"], p["output"]) for p in json.loads(r.stdout)["state_pairs"]] == \
        [(f"in_cache{i}", f"out_cache{i}") for i in range(4)]
    cfg_file = tmp_path / "seq.yaml"
    cfg_file.write_text("max_sequences: 2\nmax_sequence_idle_us: 4000000\n")
    r = _cli("convert", str(fsmn), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--name", "vad",
             "--config", str(cfg_file), "--verify", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verification"]["sequence"]["steps"] == 3 and out["verification"]["ok"]
    cfg = (tmp_path / "repo" / "vad" / "config.pbtxt").read_text()
    assert "sequence_batching" in cfg and "in_cache0" not in cfg.split("parameters")[0]   # not in the interface
    rng = np.random.default_rng(0)
    a = [rng.standard_normal((1, 6, 400)).astype(np.float32) for _ in range(3)]
    b = [rng.standard_normal((1, 6, 400)).astype(np.float32) for _ in range(3)]
    want_a, want_b = _threaded(fsmn, a), _threaded(fsmn, b)
    with TritonServer(tmp_path / "repo", mode="explicit", load_all=True) as s:
        c = tg.InferenceServerClient(s.grpc_url)

        def send(x, sid, start=False, end=False):
            i = tg.InferInput("speech", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            return c.infer("vad", [i], sequence_id=sid, sequence_start=start, sequence_end=end).as_numpy("logits")

        got_a, got_b = [], []
        for k in range(3):   # two streams interleaved
            got_a.append(send(a[k], 11, k == 0, k == 2))
            got_b.append(send(b[k], 22, k == 0, False))
        for w, g in zip(want_a + want_b, got_a + got_b):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        # max_sequences 2: 22 holds one slot, 33 the other; a third waits until one ends (END frees it)
        import threading

        send(a[0], 33, True)
        third = {}
        t = threading.Thread(target=lambda: third.setdefault("y", send(a[0], 44, True, True)))
        t.start()
        time.sleep(0.7)
        assert t.is_alive(), "a sequence past max_sequences ran while two held state"
        send(a[1], 33, end=True)
        t.join(10)
        np.testing.assert_allclose(third["y"], want_a[0], rtol=1e-6, atol=1e-6)
        # 22 left idle past 4 s: expired (Triton drops it; so does the runtime's table)
        time.sleep(5.0)
        with pytest.raises(Exception, match="START"):
            send(b[1], 22)
        c.close()
        # deploy's smoke request and bench's streams are sequences too
        r = _cli("deploy", str(tmp_path / "repo" / "vad"), "--url", s.grpc_url, "--name", "vad2", "--json",
                 env={**__import__("os").environ, "MCP_STATE_DIR": str(tmp_path / "state")})
        assert r.returncode == 0 and json.loads(r.stdout)["smoke_seconds"] is not None, r.stderr
        r = _cli("bench", "vad2", "--url", s.grpc_url, "-c", "2", "--seconds", "1", "--sequence-length", "4",
                 "--inputs", str(_npz(tmp_path, a[0])), "--json")
        p = json.loads(r.stdout)["points"][0] if r.returncode == 0 else None
        assert p and p["errors"] == 0 and p["requests"] > 8, r.stdout + r.stderr


def _npz(tmp_path, x):
    path = tmp_path / "frame.npz"
    np.savez(path, speech=x)
    return path


def test_streaming_lstm_h_c_state_on_the_server(tmp_path):
    """silero_vad_v6 (an LSTM, h/c [1, 1, 128] in, hn/cn out): served stateful by default; two
    interleaved streams of chunks, only `input` sent, equal onnxruntime with h/c threaded by hand."""
    import onnxruntime as ort
    import tritonclient.grpc as tg

    from mcp_compiler.targets.triton.serve import TritonServer

    src = zoo_model("silero_vad_v6")
    r = _cli("convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--name", "vad", "--verify")
    assert r.returncode == 0 and "h->hn, c->cn kept on the server" in r.stderr, r.stderr
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    streams = {s: [rng.standard_normal((2, 576)).astype(np.float32) * 0.1 for _ in range(3)] for s in (5, 6)}
    want = {}
    for sid, chunks in streams.items():
        h = c = np.zeros((1, 1, 128), np.float32)
        want[sid] = []
        for x in chunks:
            p, h, c = sess.run(["speech_probs", "hn", "cn"], {"input": x, "h": h, "c": c})
            want[sid].append(p)
    with TritonServer(tmp_path / "repo", mode="explicit", load_all=True) as s:
        cl = tg.InferenceServerClient(s.grpc_url)
        for k in range(3):
            for sid, chunks in streams.items():
                i = tg.InferInput("input", [2, 576], "FP32")
                i.set_data_from_numpy(chunks[k])
                got = cl.infer("vad", [i], sequence_id=sid, sequence_start=k == 0, sequence_end=k == 2).as_numpy("speech_probs")
                np.testing.assert_allclose(got, want[sid][k], rtol=1e-5, atol=1e-6)
        cl.close()


def test_growing_kv_cache_on_the_server(tmp_path):
    """A decoder step whose past keys grow by one each request: served with the cache on the server,
    three steps equal onnxruntime with the cache threaded by hand; past max_state_length the request
    fails naming the limit."""
    import onnx
    import onnxruntime as ort
    import tritonclient.grpc as tg
    from onnx import TensorProto, helper

    from mcp_compiler.targets.triton.serve import TritonServer

    F = TensorProto.FLOAT
    g = helper.make_graph([helper.make_node("Concat", ["past_key_values.0.key", "x"], ["present.0.key"], axis=1),
                           helper.make_node("ReduceMean", ["present.0.key"], ["y"], axes=[1], keepdims=0)], "step",
                          [helper.make_tensor_value_info("x", F, [1, 1, 8]),
                           helper.make_tensor_value_info("past_key_values.0.key", F, [1, "past", 8])],
                          [helper.make_tensor_value_info("y", F, [1, 8]),
                           helper.make_tensor_value_info("present.0.key", F, [1, "total", 8])])
    src = tmp_path / "step.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    (tmp_path / "b.yaml").write_text("max_state_length: 3\n")
    r = _cli("convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--name", "dec",
             "--config", str(tmp_path / "b.yaml"))
    assert r.returncode == 0, r.stderr
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    xs = [np.random.default_rng(k).standard_normal((1, 1, 8)).astype(np.float32) for k in range(4)]
    past, want = np.zeros((1, 0, 8), np.float32), []
    for x in xs[:3]:
        y, past = sess.run(None, {"x": x, "past_key_values.0.key": past})
        want.append(y)
    with TritonServer(tmp_path / "repo", mode="explicit", load_all=True) as s:
        c = tg.InferenceServerClient(s.grpc_url)

        def send(x, k):
            i = tg.InferInput("x", [1, 1, 8], "FP32")
            i.set_data_from_numpy(x)
            return c.infer("dec", [i], sequence_id=77, sequence_start=k == 0).as_numpy("y")

        for k in range(3):
            np.testing.assert_allclose(send(xs[k], k), want[k], rtol=1e-6, atol=1e-6)
        with pytest.raises(Exception, match="past max_state_length 3"):
            send(xs[3], 3)
        c.close()
