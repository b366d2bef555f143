"""The tokenizer and chat template of a decoder, with the well-kept libraries (`tokenizers`, `jinja2`).

From GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) a Hugging Face tokenizer.json
is built (byte-level BPE with its merges; control tokens as special added tokens, so that
`<|im_start|>` written in a prompt is its id); beside an ONNX decoder, its own `tokenizer.json`
and `tokenizer_config.json` are read. Both are stored in the entry (the model's metadata).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidModelError, UnsupportedError
from .spec import json_object

# GGML token types
_CONTROL, _USER_DEFINED = 3, 4
# llama.cpp's pre-tokenizers (LLAMA_VOCAB_PRE_TYPE_*) as Hugging Face pre-tokenizers: "smollm"
# splits digits one by one before GPT-2's regex; gpt2 and "default" use GPT-2's regex alone.
_PRE_DIGITS = {"smollm": True, "gpt2": False, "default": False, "starcoder": True, "qwen2": False}


@dataclass
class TokenizerInfo:
    tokenizer_json: str
    chat_template: str | None
    bos_id: int | None
    eos_ids: list[int]
    add_bos: bool = False
    special: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"chat_template": self.chat_template, "bos_id": self.bos_id, "eos_ids": self.eos_ids,
                           "add_bos": self.add_bos})

    @classmethod
    def from_json(cls, meta: str, tokenizer_json: str) -> TokenizerInfo:
        d = json.loads(meta)
        return cls(tokenizer_json, d.get("chat_template"), d.get("bos_id"), list(d.get("eos_ids", [])),
                   bool(d.get("add_bos")))


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


class ChatTokenizer:
    """encode / decode / the chat template, over a TokenizerInfo."""

    def __init__(self, info: TokenizerInfo) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UnsupportedError("tokenizing needs the `tokenizers` package (pip install 'mcp-cli[llm]')") from None
        self.info = info
        self.tok = Tokenizer.from_str(info.tokenizer_json)

    def encode(self, text: str) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if self.info.add_bos and self.info.bos_id is not None:
            ids = [self.info.bos_id, *ids]
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def token(self, i: int) -> str:
        return self.tok.id_to_token(i)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.info.chat_template:
            raise UnsupportedError("the model has no chat template: give a plain prompt")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        bos = self.token(self.info.bos_id) if self.info.bos_id is not None else ""
        eos = self.token(self.info.eos_ids[0]) if self.info.eos_ids else ""
        return env.from_string(self.info.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)
