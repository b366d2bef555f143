"""GGUF in: exact repacking of each block type, the decoder against an independent numpy
implementation, batched steps of different lengths, convert/verify/inspect as a user runs them,
ONNX decoders with Optimum's names, and bad GGUF files refused in one line."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[llm]')")
import gguf
from _tiny import CONTEXT, HIDDEN, KV_HEADS, VOCAB, numpy_forward, write_tiny_gguf

from mcp_compiler.llm.quants import repack

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_repacked_blocks_dequantize_bit_exactly_as_gguf(kind):
    rng = np.random.default_rng(1)
    data = (rng.standard_normal((48, 96)) * 3).astype(np.float32)
    data[0, :32] = 0.0                                  # a block of zeros (d = 0)
    q = gguf.quants.quantize(data, gguf.GGMLQuantizationType[kind])
    want = gguf.dequantize(q, gguf.GGMLQuantizationType[kind]).reshape(48, 96)
    got = repack(kind, q, 48, 96).dequantize()
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_matmulnbits_parts_dequantize_as_the_repacked_weight(kind):
    # onnxruntime's own MatMulNBits against the identity: each part's weight, bit for bit
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    q = gguf.quants.quantize(rng.standard_normal((40, 64)).astype(np.float32), gguf.GGMLQuantizationType[kind])
    w = repack(kind, q, 40, 64)
    for p in w.parts:
        node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=64, N=40, bits=4,
                                block_size=32, accuracy_level=0)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [64, 40])],
                              [numpy_helper.from_array(p.codes, "B"), numpy_helper.from_array(p.scales(), "S"),
                               numpy_helper.from_array(p.zero_points(), "Z")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        got = s.run(None, {"A": np.eye(64, dtype=np.float32)})[0].T
        assert np.array_equal(got, p.dequantize().reshape(40, 64))
        onnx.checker.check_model(m)


def test_k_quants_are_refused_by_name(tmp_path):
    p = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    # 4 rows of 256 elements as Q4_K: 144 bytes a 256-element super-block
    w.add_tensor("token_embd.weight", np.zeros((4, 144), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = _cli("convert", str(p), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"))
    assert r.returncode == 2 and "Q4_K" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "repo").exists()


def _decoder(path: Path, last_logits: bool = True, fused: bool = True):
    from mcp_compiler.frontend.gguf import gguf_decoder
    from mcp_compiler.llm.verify import OrtRunner
    from mcp_compiler.targets.triton.runtime.decoder import Decoder

    return Decoder(OrtRunner(gguf_decoder(path, last_logits=last_logits, fused=fused).SerializeToString()))


# fused: onnxruntime's fused ops, GroupQueryAttention's packed cache (the entry's graph); plain:
# Optimum's graph as torch exports it, its cache padded (what a user's ONNX decoder brings)
LAYOUTS = pytest.mark.parametrize("fused", [True, False], ids=["packed", "padded"])


@LAYOUTS
def test_decoder_matches_an_independent_numpy_llama(tiny, fused):
    ids = [1, 5, 7, 9, 11, 2, 40, 41]
    want = numpy_forward(tiny, ids)                      # float64, gguf's dequantized weights
    dec = _decoder(tiny, last_logits=False, fused=fused)
    assert dec.layout == ("packed" if fused else "padded")
    feeds = {"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), np.int64),
             "position_ids": np.arange(len(ids))[None]}
    for i in range(dec.layers):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = np.zeros((1, KV_HEADS, 0, HIDDEN // 4), np.float32)
    got = dec.runner.run(feeds, ["logits"])[0][0]
    assert got.shape == (len(ids), VOCAB)
    assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()
    # one token at a time through the cache: the same logits as the whole sequence at once
    seq = dec.sequence(ids[:3])
    rows = [dec.step([seq])[0]]
    for t in ids[3:]:
        seq.pending = [t]
        rows.append(dec.step([seq])[0])
    np.testing.assert_allclose(np.array(rows), want[2:], atol=1e-3 * np.abs(want).max())


@LAYOUTS
def test_one_step_runs_sequences_of_different_lengths(tiny, fused):
    dec = _decoder(tiny, fused=fused)
    prompts = [[1, 5, 7], [1, 9, 11, 13, 15, 17, 19], [3]]
    alone = []
    for p in prompts:
        s = dec.sequence(p)
        first = dec.step([s])[0]
        s.pending = [int(first.argmax())]
        alone.append((first, dec.step([s])[0]))
    seqs = [dec.sequence(p) for p in prompts]
    firsts = dec.step(seqs)                               # prefills of 3 lengths in one step
    for s, f in zip(seqs, firsts):
        s.pending = [int(f.argmax())]
    seconds = dec.step(seqs)                              # then one decode step for all
    for (f1, s1), f2, s2 in zip(alone, firsts, seconds):
        np.testing.assert_allclose(f2, f1, atol=1e-4)
        np.testing.assert_allclose(s2, s1, atol=1e-4)
    assert [s.length for s in seqs] == [len(p) + 1 for p in prompts]
    # a prompt's prefill beside the others' decode steps (continuous batching's step), then all
    # decoding: as each sequence alone
    late = [1, 21, 22, 23]
    alone_seq = dec.sequence(late)
    want = [dec.step([alone_seq])[0]]
    alone_seq.pending = [int(want[0].argmax())]
    want.append(dec.step([alone_seq])[0])
    for s, row in zip(seqs, seconds):
        s.pending = [int(row.argmax())]
    solo = [dec.step([dec.sequence(s.tokens + s.pending)])[0] for s in seqs]
    joined = dec.sequence(late)
    mixed = dec.step(seqs + [joined])
    for a, b in zip(mixed[:3], solo):
        np.testing.assert_allclose(a, b, atol=1e-4)
    np.testing.assert_allclose(mixed[3], want[0], atol=1e-4)
    for s, row in zip(seqs + [joined], mixed):
        s.pending = [int(row.argmax())]
    again = dec.step(seqs + [joined])
    np.testing.assert_allclose(again[3], want[1], atol=1e-4)


def test_convert_verify_and_inspect_a_gguf(tiny, tmp_path):
    r = _cli("convert", str(tiny), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--verify", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    v = rep["verification"]
    assert v["kind"] == "llm" and v["ok"] and v["prompts"] == 4 and len(v["results"]) == 4
    assert all(x["first_difference"] is None and x["steps"] >= 1 for x in v["results"])
    assert "float32" in v["reference"]
    assert not any("state kept with the client" in w for w in rep["warnings"])
    entry = tmp_path / "repo" / "tiny"
    assert (entry / "1" / "model.mcpir").is_file() and (entry / "1" / "mcp_runtime" / "decoder.py").is_file()
    r = _cli("inspect", str(tiny), "--json")
    assert r.returncode == 0, r.stderr
    llm = json.loads(r.stdout)["llm"]
    assert (llm["layers"], llm["kv_heads"], llm["head_size"], llm["context"]) == (2, KV_HEADS, HIDDEN // 4, CONTEXT)
    assert llm["cache_bytes_per_token"] == 2 * 2 * KV_HEADS * (HIDDEN // 4) * 4
    r = _cli("inspect", str(tiny))
    assert "KV cache" in r.stdout and "bytes a token" in r.stdout, r.stdout


def test_onnx_out_is_an_optimum_decoder_that_converts_and_verifies(tiny, tmp_path):
    import onnxruntime as ort

    out = tmp_path / "decoder.onnx"
    r = _cli("convert", str(tiny), "-o", str(out))
    assert r.returncode == 0, r.stderr
    s = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])   # plain onnxruntime
    names = [i.name for i in s.get_inputs()]
    # onnxruntime-genai's interface: its rotary counts positions from the cache (no position_ids)
    assert names[:3] == ["input_ids", "attention_mask", "past_key_values.0.key"] and "past_key_values.1.value" in names
    assert [o.name for o in s.get_outputs()][:2] == ["logits", "present.0.key"]
    assert s.get_outputs()[0].shape == ["batch_size", "sequence_length", VOCAB]
    # that ONNX decoder is recognised as an LLM and converts to the same kind of entry
    r = _cli("inspect", str(out), "--json")
    assert json.loads(r.stdout)["llm"]["layers"] == 2
    r = _cli("convert", str(out), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--verify", "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)["verification"]
    assert v["kind"] == "llm" and v["ok"] and "original" in v["reference"]
    # as onnxruntime-genai writes it (GroupQueryAttention, no mcp-cli record): its cache is known packed
    import onnx

    from mcp_compiler.targets.triton.verify import load_runtime

    m = onnx.load(str(out))
    del m.metadata_props[:]
    onnx.save(m, str(tmp_path / "genai.onnx"))
    r = _cli("convert", str(tmp_path / "genai.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path / "repo2"), "--verify")
    assert r.returncode == 0, r.stderr
    rt = load_runtime(tmp_path / "repo2" / "genai" / "1")
    dec = rt.Decoder(rt.MCPIRModel(tmp_path / "repo2" / "genai" / "1" / "model.mcpir"))
    assert dec.layout == "packed"
    seqs = [dec.sequence([1, 5, 7]), dec.sequence([1, 9, 11, 13, 15])]
    both = dec.step(seqs)
    alone = [dec.step([dec.sequence(p)])[0] for p in ([1, 5, 7], [1, 9, 11, 13, 15])]
    np.testing.assert_allclose(both, np.array(alone), atol=1e-4)


def _truncated(p: Path, d: Path) -> Path:
    q = d / "truncated.gguf"
    q.write_bytes(p.read_bytes()[: p.stat().st_size - 5000])
    return q


def _unknown_arch(p: Path, d: Path) -> Path:
    return write_tiny_gguf(d / "arch.gguf", arch="gptneox")


def _lying_header(p: Path, d: Path) -> Path:
    return write_tiny_gguf(d / "lying.gguf", meta_layers=7)   # says 7 blocks, carries 2


def _bad_size(p: Path, d: Path) -> Path:
    # the tensor count in the header raised past the tensors the file describes
    data = bytearray(p.read_bytes())
    n = struct.unpack_from("<Q", data, 8)[0]
    struct.pack_into("<Q", data, 8, n + 50)
    q = d / "count.gguf"
    q.write_bytes(bytes(data))
    return q


def _shape_lie(p: Path, d: Path) -> Path:
    # one tensor's dims in its info record doubled: its bytes disagree with its shape
    data = bytearray(p.read_bytes())
    name = b"blk.0.ffn_down.weight"
    i = data.index(name) + len(name)
    ndims = struct.unpack_from("<I", data, i)[0]
    assert ndims == 2
    dim0 = struct.unpack_from("<Q", data, i + 4)[0]
    struct.pack_into("<Q", data, i + 4, dim0 * 2)
    q = d / "shape.gguf"
    q.write_bytes(bytes(data))
    return q


@pytest.mark.parametrize("make,expect", [(_truncated, "truncated"), (_unknown_arch, "gptneox"),
                                         (_lying_header, "blk.2"), (_bad_size, "GGUF"), (_shape_lie, "ffn_down")],
                         ids=["truncated", "unknown-architecture", "lying-header", "tensor-count", "size-vs-shape"])
def test_bad_gguf_one_error_line_exit_2_nothing_written(tiny, tmp_path, make, expect):
    bad = make(tiny, tmp_path)
    r = _cli("convert", str(bad), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "repo").exists() and not list(tmp_path.glob(".*staging*"))
    assert expect in lines[0], lines[0]


def test_recorded_request_of_a_decoder_entry_runs(tiny, tmp_path):
    # --no-generation: the raw decoder step served; bench --url and clients with the config alone send this request: the mask's length must be
    # the cache's plus the new tokens' (sized alike, every request failed in the served model)
    from mcp_compiler.targets.triton.entry import read_config
    from mcp_compiler.targets.triton.verify import load_runtime

    r = _cli("convert", str(tiny), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--no-generation")
    assert r.returncode == 0, r.stderr
    entry = tmp_path / "repo" / "tiny"
    request = json.loads(read_config(entry, missing="no config").parameters["mcp_request"].string_value)
    shapes = {k: v["shape"] for k, v in request.items()}
    assert shapes["attention_mask"][1] == shapes["input_ids"][1] + shapes["past_key_values.0.key"][2]
    rng = np.random.default_rng(0)
    feeds = {}
    for name, spec in request.items():
        how = spec["values"]
        if how[0] == "range":
            feeds[name] = rng.integers(how[1], how[2], spec["shape"]).astype(np.int64)
        elif how[0] == "choice":
            feeds[name] = rng.choice(how[1], spec["shape"]).astype(np.int64)
        else:
            feeds[name] = rng.standard_normal(spec["shape"]).astype(np.float32)
    model = load_runtime(entry / "1").MCPIRModel(entry / "1" / "model.mcpir")
    logits = model.run(feeds, ["logits"])[0]
    assert logits.shape == (1, 1, VOCAB) and np.isfinite(logits).all()
