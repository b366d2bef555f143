"""What makes a graph a decoder LLM, found from its interface, and what the entry records of it.

A decoder is recognised by Optimum's names (`input_ids`, `past_key_values.N.key/value` ->
`logits`, `present.N.key/value`) or onnxruntime-genai's (`past_key_values.N.key` with
GroupQueryAttention inside): layers, KV heads and head size come from the cache inputs; the
context length from the entry's own record (GGUF) or the config.json beside an ONNX decoder.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

LLM_KEY, TOKENIZER_KEY, GENERATION_KEY = "mcp.llm", "mcp.tokenizer", "mcp.generation"
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


@dataclass
class LLMInfo:
    layers: int
    kv_heads: int | None
    head_size: int | None
    context: int | None = None
    heads: int | None = None
    hidden: int | None = None
    vocab: int | None = None
    architecture: str | None = None
    source: dict | None = None
    last_logits: bool = False     # the graph takes logits_index: logits [batch, 1, vocab]
    kv_layout: str | None = None  # what the model records: packed (GroupQueryAttention's), padded

    @property
    def cache_bytes_per_token(self) -> int | None:
        if self.kv_heads is None or self.head_size is None:
            return None
        return 2 * self.layers * self.kv_heads * self.head_size * 4

    def to_dict(self) -> dict:
        return {**asdict(self), "cache_bytes_per_token": self.cache_bytes_per_token}


def spec_json(spec, source: dict, kv_layout: str) -> str:  # noqa: ANN001 - gguf_file.DecoderSpec
    return json.dumps({"architecture": spec.architecture, "name": spec.name, "layers": spec.layers,
                       "hidden": spec.hidden, "heads": spec.heads, "kv_heads": spec.kv_heads,
                       "head_size": spec.head_size, "ffn": spec.ffn, "context": spec.context,
                       "vocab": spec.vocab, "rope_base": spec.rope_base, "rms_eps": spec.rms_eps,
                       "tied": spec.tied, "kv_layout": kv_layout, "source": source})


def _int(d: object) -> int | None:
    v = getattr(d, "value", d)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def find_llm(model, path: Path | None = None) -> LLMInfo | None:  # noqa: ANN001 - mcp_compiler.ir.Model
    """The model's LLM description, or None when it is not a decoder with a KV cache."""
    g = model.graph
    names = {v.name: v for v in g.inputs}
    outs = {v.name for v in g.outputs}
    if "input_ids" not in names or "logits" not in outs:
        return None
    layers = sorted({int(m.group(1)) for n in names if (m := _PAST.match(n))})
    if not layers or layers != list(range(len(layers))):
        return None
    if not all(f"present.{i}.key" in outs and f"present.{i}.value" in outs for i in layers):
        return None
    past = names["past_key_values.0.key"]
    dims = list(getattr(past.type, "shape", None) or [])
    kv_heads = _int(dims[1]) if len(dims) == 4 else None
    head_size = _int(dims[3]) if len(dims) == 4 else None
    recorded = json.loads(model.metadata_props.get(LLM_KEY) or "null")
    info = LLMInfo(len(layers), kv_heads, head_size, last_logits="logits_index" in names,
                   kv_layout=recorded.get("kv_layout") if isinstance(recorded, dict) else None)
    if isinstance(recorded, dict) and "layers" in recorded:   # mcp-cli's own record (GGUF)
        for k in ("context", "heads", "hidden", "vocab", "architecture", "source"):
            setattr(info, k, recorded.get(k))
    elif path is not None:
        cfg = json_object(Path(path).parent / "config.json")
        info.context = cfg.get("max_position_embeddings")
        info.heads, info.hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
        info.vocab, info.architecture = cfg.get("vocab_size"), cfg.get("model_type")
        info.source = {"format": "onnx"}
    return info


def mark_layout(model) -> None:  # noqa: ANN001 - mcp_compiler.ir.Model
    """An ONNX decoder whose attention is GroupQueryAttention (onnxruntime-genai's builder) keeps
    its cache packed: recorded for the runtime (mcp_runtime.decoder reads `kv_layout`)."""
    if LLM_KEY in model.metadata_props or find_llm(model) is None:
        return
    if any(n.op_type == "GroupQueryAttention" for n in model.graph.nodes):
        model.metadata_props[LLM_KEY] = json.dumps({"kv_layout": "packed"})


# a decoder request's default: a prefill of REQUEST_NEW tokens after REQUEST_PAST cached ones
REQUEST_PAST, REQUEST_NEW = 16, 16


def decoder_sizes(model, given: dict[str, int]) -> dict[str, int]:  # noqa: ANN001 - mcp_compiler.ir.Model
    """A decoder's cache, new-token and mask lengths for a request: the mask's length is the past's
    plus the new tokens' (no op says so in a way shape inference can use: the mask's bias
    broadcasts against the scores), sized together from what `given` fixes; {} for a model that is
    not a decoder, or whose three lengths are not distinct symbols."""
    if find_llm(model) is None:
        return {}
    shapes = {v.name: list(getattr(v.type, "shape", None) or []) for v in model.graph.inputs}
    try:
        new, past, total = (shapes["input_ids"][1], shapes["past_key_values.0.key"][2], shapes["attention_mask"][1])
    except (KeyError, IndexError):
        return {}
    if not all(isinstance(s, str) for s in (new, past, total)) or len({new, past, total}) < 3:
        return {}
    p, n = given.get(past, REQUEST_PAST), given.get(new, REQUEST_NEW)
    if total in given and given[total] != p + n:
        from ..errors import UsageError

        raise UsageError(f"--dims {total}={given[total]}: a decoder's mask covers the cache and the new tokens, "
                         f"{past} + {new} = {p + n}")
    return {past: p, new: n, total: p + n}


def json_object(p: Path) -> dict:
    """A JSON file's object; {} when it is absent, unreadable or not an object (optional files
    beside a model: config.json, tokenizer_config.json)."""
    try:
        d = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}
