"""The tokenizer and chat template of a decoder, with the well-kept libraries (`tokenizers`, `jinja2`).

From GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) a Hugging Face tokenizer.json
is built (byte-level BPE with its merges; control tokens as special added tokens, so that
`<|im_start|>` written in a prompt is its id); beside an ONNX decoder, its own `tokenizer.json`
and `tokenizer_config.json` are read. Both are stored in the entry (the model's metadata); the entry's runtime (runtime/text.py)
tokenizes with them.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InvalidModelError, UnsupportedError
from ..targets.triton.runtime.text import ChatTokenizer as _RuntimeTokenizer
from ..targets.triton.runtime.text import TokenizerInfo
from .spec import json_object

__all__ = ["ChatTokenizer", "TokenizerInfo", "beside_onnx", "from_gguf"]

# GGML token types
_CONTROL, _USER_DEFINED = 3, 4
# llama.cpp's pre-tokenizers (LLAMA_VOCAB_PRE_TYPE_*) as Hugging Face pre-tokenizers: "smollm"
# splits digits one by one before GPT-2's regex; gpt2 and "default" use GPT-2's regex alone.
_PRE_DIGITS = {"smollm": True, "gpt2": False, "default": False, "starcoder": True, "qwen2": False}


def from_gguf(meta: dict, path: Path) -> TokenizerInfo:
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedError(f"{path.name}: tokenizer model {model!r} is not supported (gpt2: byte-level BPE)")
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges", [])
    types = meta.get("tokenizer.ggml.token_type") or []
    if not isinstance(tokens, list) or not isinstance(merges, list) or not tokens \
            or not all(isinstance(t, str) for t in tokens) or not all(isinstance(m, str) and " " in m for m in merges):
        raise InvalidModelError(path, "GGUF metadata tokenizer.ggml.tokens / merges are missing or not strings")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_DIGITS:
        raise UnsupportedError(f"{path.name}: pre-tokenizer {pre!r} is not supported ({', '.join(_PRE_DIGITS)})")
    vocab = {t: i for i, t in enumerate(tokens)}
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == _CONTROL}
             for i in range(min(len(types), len(tokens))) if types[i] in (_CONTROL, _USER_DEFINED)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    pre_tok = byte_level if not _PRE_DIGITS[pre] else \
        {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre_tok, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": [m.split(" ", 1) for m in merges]}}
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    eos_ids = [int(i) for i in (eos, eot) if isinstance(i, int) and 0 <= i < len(tokens)]
    bos = meta.get("tokenizer.ggml.bos_token_id")
    template = meta.get("tokenizer.chat_template")
    return TokenizerInfo(json.dumps(spec, ensure_ascii=False), template if isinstance(template, str) else None,
                         int(bos) if isinstance(bos, int) else None, sorted(set(eos_ids)),
                         bool(meta.get("tokenizer.ggml.add_bos_token", False)))


def beside_onnx(model_path: Path) -> TokenizerInfo | None:
    """tokenizer.json (and tokenizer_config.json, generation_config.json) beside an ONNX decoder."""
    folder = model_path.parent
    tj = folder / "tokenizer.json"
    if not tj.is_file():
        return None
    text = tj.read_text(encoding="utf-8")
    cfg = json_object(folder / "tokenizer_config.json")
    gen = json_object(folder / "generation_config.json")
    vocab = {a["content"]: a["id"] for a in json.loads(text).get("added_tokens", [])}

    def token_id(v: object) -> int | None:
        if isinstance(v, dict):
            v = v.get("content")
        return vocab.get(v) if isinstance(v, str) else None

    eos = gen.get("eos_token_id", token_id(cfg.get("eos_token")))
    eos_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int)]
    return TokenizerInfo(text, cfg.get("chat_template") if isinstance(cfg.get("chat_template"), str) else None,
                         token_id(cfg.get("bos_token")), eos_ids)


class ChatTokenizer(_RuntimeTokenizer):
    """The entry runtime's tokenizer, its failures as mcp-cli's errors."""

    def __init__(self, info: TokenizerInfo) -> None:
        try:
            super().__init__(info)
        except ImportError:
            raise UnsupportedError("tokenizing needs the `tokenizers` package (pip install 'mcp-cli[llm]')") from None

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        try:
            return super().chat(messages, add_generation_prompt)
        except ValueError as e:
            raise UnsupportedError(str(e)) from None
