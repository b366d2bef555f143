"""A small LLaMA-shaped GGUF written with gguf's own writer (random weights, every supported
tensor type), and an independent numpy forward pass of the same decoder to check against."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB, CONTEXT = 64, 4, 2, 96, 2, 160, 128
# each weight of a block gets one of the supported types
TYPES = {"attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "Q8_0", "attn_output": "Q4_1",
         "ffn_gate": "Q4_1", "ffn_up": "Q4_1", "ffn_down": "Q4_0"}


def write_tiny_gguf(path: Path, *, seed: int = 0, embd_type: str = "Q8_0", arch: str = "llama",
                    layers: int = LAYERS, types: dict | None = None, meta_layers: int | None = None) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(meta_layers if meta_layers is not None else layers)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(0x100 + i) if i >= 94 else chr(33 + i)
                                                                 for i in range(VOCAB - 3)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (VOCAB - 3))
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    def add(name: str, shape: tuple, kind: str, scale: float = 0.2) -> None:
        data = (rng.standard_normal(shape) * scale).astype(np.float32)
        if kind == "F32":
            w.add_tensor(name, data)
            return
        q = gguf.quants.quantize(data, gguf.GGMLQuantizationType[kind])
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType[kind])

    add("token_embd.weight", (VOCAB, HIDDEN), embd_type, 1.0)
    add("output_norm.weight", (HIDDEN,), "F32", 1.0)
    kv = KV_HEADS * HIDDEN // HEADS
    t = types or TYPES
    for i in range(layers):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (HIDDEN,), "F32", 1.0)
        add(b + "ffn_norm.weight", (HIDDEN,), "F32", 1.0)
        add(b + "attn_q.weight", (HIDDEN, HIDDEN), t["attn_q"])
        add(b + "attn_k.weight", (kv, HIDDEN), t["attn_k"])
        add(b + "attn_v.weight", (kv, HIDDEN), t["attn_v"])
        add(b + "attn_output.weight", (HIDDEN, HIDDEN), t["attn_output"])
        add(b + "ffn_gate.weight", (FFN, HIDDEN), t["ffn_gate"])
        add(b + "ffn_up.weight", (FFN, HIDDEN), t["ffn_up"])
        add(b + "ffn_down.weight", (HIDDEN, FFN), t["ffn_down"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def numpy_forward(path: Path, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab] of the whole sequence at once, computed in float64 from gguf's
    dequantized weights: LLaMA as llama.cpp computes it (rotary on adjacent pairs)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    W = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed([int(d) for d in t.shape]))
        W[t.name] = gguf.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    hd = HIDDEN // HEADS
    n = len(ids)
    x = W["token_embd.weight"][ids]

    def norm(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-5) * g

    inv = 1.0 / (10000.0 ** (np.arange(0, hd, 2) / hd))
    ang = np.outer(np.arange(n), inv)                      # [n, hd/2]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):                                           # [heads, n, hd]
        a, b = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
        return out

    layers = len({k.split(".")[1] for k in W if k.startswith("blk.")})
    for i in range(layers):
        b = f"blk.{i}."
        h = norm(x, W[b + "attn_norm.weight"])
        q = rope((h @ W[b + "attn_q.weight"].T).reshape(n, HEADS, hd).transpose(1, 0, 2))
        k = rope((h @ W[b + "attn_k.weight"].T).reshape(n, KV_HEADS, hd).transpose(1, 0, 2))
        v = (h @ W[b + "attn_v.weight"].T).reshape(n, KV_HEADS, hd).transpose(1, 0, 2)
        k, v = np.repeat(k, HEADS // KV_HEADS, 0), np.repeat(v, HEADS // KV_HEADS, 0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + np.triu(np.full((n, n), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + (p @ v).transpose(1, 0, 2).reshape(n, HIDDEN) @ W[b + "attn_output.weight"].T
        h = norm(x, W[b + "ffn_norm.weight"])
        g = h @ W[b + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ W[b + "ffn_up.weight"].T)) @ W[b + "ffn_down.weight"].T
    x = norm(x, W["output_norm.weight"])
    return x @ W.get("output.weight", W["token_embd.weight"]).T
