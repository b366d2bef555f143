"""Read a GGUF file with llama.cpp's own reader (PyPI `gguf`) into a checked decoder description.

Everything is checked before any work: the architecture, every hyperparameter the graph needs,
every tensor's name, type and shape, and that its bytes lie inside the file. What it cannot build
is refused by name (an architecture, a tensor type: the K-quants among them).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InvalidModelError, UnsupportedError
from .quants import BLOCK, BLOCK_BYTES, QUANTIZED

MAGIC = b"GGUF"
# Architectures whose blocks are the LLaMA graph (RMSNorm, rotary, grouped-query attention,
# SwiGLU): llama and mistral as GGML writes them (rotary on adjacent pairs: convert_hf_to_gguf
# permutes Q and K for it), qwen2 with Q/K/V biases and rotary on half-split dims (NEOX).
ARCHITECTURES = {"llama": {"rope": "interleaved", "qkv_bias": False},
                 "mistral": {"rope": "interleaved", "qkv_bias": False},
                 "qwen2": {"rope": "half", "qkv_bias": True}}
DENSE = ("F32", "F16")
TYPES = (*DENSE, *QUANTIZED)
MAX_LAYERS, MAX_DIM, MAX_CONTEXT = 1024, 1 << 17, 1 << 22


def is_gguf(head: bytes) -> bool:
    return head[:4] == MAGIC


def is_gguf_file(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return is_gguf(f.read(4))
    except OSError:
        return False


@dataclass
class DecoderSpec:
    architecture: str
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_size: int
    ffn: int
    context: int
    vocab: int
    rms_eps: float
    rope_base: float
    rope_scale: float = 1.0          # linear scaling: positions / factor
    rope: str = "interleaved"        # interleaved (GGML's NORM) | half (NEOX)
    qkv_bias: bool = False
    tied: bool = True                # the LM head is the token embedding

    @property
    def cache_bytes_per_token(self) -> int:
        """float32 K and V of every layer."""
        return 2 * self.layers * self.kv_heads * self.head_size * 4


@dataclass
class GGUFTensor:
    name: str
    type: str              # GGML type name
    shape: tuple[int, ...]  # numpy order: rows first ([N, K] for a weight)
    data: np.ndarray       # a view of the file's bytes (rows of blocks for a quantized type)


@dataclass
class GGUFModel:
    path: Path
    spec: DecoderSpec
    tensors: dict[str, GGUFTensor]
    metadata: dict[str, object] = field(default_factory=dict)   # tokenizer and general.* fields
    file_bytes: int = 0
    rope_freqs: np.ndarray | None = None


def _fields(reader, path: Path) -> dict[str, object]:  # noqa: ANN001 - a gguf.GGUFReader
    out = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = f.contents()
        except Exception as e:  # noqa: BLE001 - the reader's own parse of a hostile value
            raise InvalidModelError(path, f"GGUF metadata {key!r} does not read: {e}") from None
    return out


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Open and check a GGUF decoder (the last file read is kept while it is unchanged on disk:
    `convert --verify` builds the entry's graph and the float32 reference from one read; gguf's
    reader alone takes ~3.4 s on SmolLM2-135M's 49k-token vocabulary).

    Raises:
        InvalidModelError: not GGUF, truncated, a lying header, a tensor whose bytes disagree
            with its shape, a missing or out-of-range hyperparameter.
        UnsupportedError: an architecture or tensor type this frontend does not build.
    """
    path = Path(path)
    st = path.stat()
    return _read(path, path.resolve(), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=1)
def _read(path: Path, real: Path, size: int, mtime_ns: int, inode: int) -> GGUFModel:
    """(`real`, the size, mtime and inode: the cache's key; messages name `path` as given)"""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UnsupportedError("reading GGUF needs the `gguf` package (pip install 'mcp-cli[llm]')") from None
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # noqa: BLE001 - gguf raises ValueError, struct/numpy errors on bad bytes
        raise InvalidModelError(path, "not a readable GGUF file: truncated, or a header that does not match its data "
                                      f"({type(e).__name__}: {str(e)[:160]})") from None
    meta = _fields(reader, path)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise InvalidModelError(path, "GGUF metadata has no general.architecture")
    if arch not in ARCHITECTURES:
        raise InvalidModelError(path, f"GGUF architecture {arch!r} is not supported "
                                      f"(supported: {', '.join(ARCHITECTURES)})")
    tensors = _tensors(reader, path, size)
    spec = _spec(meta, arch, tensors, path)
    _check_tensors(spec, tensors, path)
    freqs = tensors.pop("rope_freqs.weight", None)
    return GGUFModel(path, spec, tensors, metadata=meta, file_bytes=size,
                     rope_freqs=None if freqs is None else np.asarray(freqs.data, np.float32).reshape(-1))


def _tensors(reader, path: Path, size: int) -> dict[str, GGUFTensor]:  # noqa: ANN001
    out = {}
    for t in reader.tensors:
        tname = t.tensor_type.name
        shape = tuple(int(d) for d in reversed([int(x) for x in t.shape]))
        if tname not in TYPES:
            raise InvalidModelError(path, f"tensor {t.name} is {tname}, which this frontend does not convert "
                                          f"exactly (supported: {', '.join(TYPES)}); requantize the GGUF to Q4_0, "
                                          "Q4_1 or Q8_0")
        if t.name in out:
            raise InvalidModelError(path, f"tensor {t.name} is listed twice")
        count = math.prod(shape)
        if tname in BLOCK_BYTES:
            if shape[-1] % BLOCK:
                raise InvalidModelError(path, f"tensor {t.name}: a row of {shape[-1]} is not whole {BLOCK}-blocks")
            want = count // BLOCK * BLOCK_BYTES[tname]
        else:
            want = count * (4 if tname == "F32" else 2)
        got = int(t.n_bytes)
        if got != want or int(t.data.nbytes) != want:
            raise InvalidModelError(path, f"tensor {t.name}: {int(t.data.nbytes)} bytes where its shape "
                                          f"{list(shape)} of {tname} needs {want}")
        if int(t.data_offset) + want > size:
            raise InvalidModelError(path, f"tensor {t.name} runs past the end of the file (truncated?)")
        data = t.data if tname in BLOCK_BYTES else np.asarray(t.data).reshape(shape)
        out[t.name] = GGUFTensor(t.name, tname, shape, data)
    return out


def _int(meta: dict, key: str, path: Path, lo: int = 1, hi: int = MAX_DIM, default: int | None = None) -> int:
    v = meta.get(key, default)
    if v is None:
        raise InvalidModelError(path, f"GGUF metadata has no {key}")
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
        raise InvalidModelError(path, f"GGUF metadata {key} = {v!r} is not a whole number in {lo}..{hi}")
    return int(v)


def _float(meta: dict, key: str, path: Path, default: float | None = None) -> float:
    v = meta.get(key, default)
    if v is None:
        raise InvalidModelError(path, f"GGUF metadata has no {key}")
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v) or v <= 0:
        raise InvalidModelError(path, f"GGUF metadata {key} = {v!r} is not a finite positive number")
    return float(v)


def _spec(meta: dict, arch: str, tensors: dict[str, GGUFTensor], path: Path) -> DecoderSpec:
    a = arch
    hidden = _int(meta, f"{a}.embedding_length", path)
    heads = _int(meta, f"{a}.attention.head_count", path, hi=4096)
    kv_heads = _int(meta, f"{a}.attention.head_count_kv", path, hi=4096, default=heads)
    if hidden % heads or heads % kv_heads:
        raise InvalidModelError(path, f"{hidden} hidden over {heads} heads and {kv_heads} KV heads do not divide")
    head_size = hidden // heads
    rot = _int(meta, f"{a}.rope.dimension_count", path, default=head_size)
    if rot != head_size or head_size % 2:
        raise UnsupportedError(f"{path.name}: rotary over {rot} of {head_size} head dims is not supported")
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise InvalidModelError(path, "has no token_embd.weight")
    vocab = _int(meta, f"{a}.vocab_size", path, hi=1 << 22, default=embd.shape[0])
    scaling = meta.get(f"{a}.rope.scaling.type", "none")
    scale = 1.0
    if scaling == "linear":
        scale = _float(meta, f"{a}.rope.scaling.factor", path)
    elif scaling not in ("none", None):
        raise UnsupportedError(f"{path.name}: rope scaling {scaling!r} is not supported (none, linear)")
    name = meta.get("general.name")
    return DecoderSpec(
        architecture=a, name=name if isinstance(name, str) else path.stem,
        layers=_int(meta, f"{a}.block_count", path, hi=MAX_LAYERS), hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_size=head_size, ffn=_int(meta, f"{a}.feed_forward_length", path, hi=1 << 20),
        context=_int(meta, f"{a}.context_length", path, hi=MAX_CONTEXT), vocab=vocab,
        rms_eps=_float(meta, f"{a}.attention.layer_norm_rms_epsilon", path),
        rope_base=_float(meta, f"{a}.rope.freq_base", path, default=10000.0), rope_scale=scale,
        tied="output.weight" not in tensors, **ARCHITECTURES[a])


def expected_shapes(spec: DecoderSpec) -> dict[str, tuple[int, ...]]:
    s = spec
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (s.vocab, s.hidden), "output_norm.weight": (s.hidden,)}
    if not s.tied:
        shapes["output.weight"] = (s.vocab, s.hidden)
    kv = s.kv_heads * s.head_size
    for i in range(s.layers):
        b = f"blk.{i}."
        shapes.update({b + "attn_norm.weight": (s.hidden,), b + "ffn_norm.weight": (s.hidden,),
                       b + "attn_q.weight": (s.hidden, s.hidden), b + "attn_k.weight": (kv, s.hidden),
                       b + "attn_v.weight": (kv, s.hidden), b + "attn_output.weight": (s.hidden, s.hidden),
                       b + "ffn_gate.weight": (s.ffn, s.hidden), b + "ffn_up.weight": (s.ffn, s.hidden),
                       b + "ffn_down.weight": (s.hidden, s.ffn)})
        if s.qkv_bias:
            shapes.update({b + "attn_q.bias": (s.hidden,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
    return shapes


def _check_tensors(spec: DecoderSpec, tensors: dict[str, GGUFTensor], path: Path) -> None:
    want = expected_shapes(spec)
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            raise InvalidModelError(path, f"has no tensor {name} (a {spec.architecture} decoder of {spec.layers} blocks needs it)")
        if t.shape != shape:
            raise InvalidModelError(path, f"tensor {name} has shape {list(t.shape)}, the header says {list(shape)}")
        if len(shape) == 1 and t.type not in DENSE:
            raise UnsupportedError(f"{path.name}: norm/bias tensor {name} is {t.type}")
    extra = sorted(set(tensors) - set(want) - {"rope_freqs.weight"})
    if extra:
        raise UnsupportedError(f"{path.name}: tensors this {spec.architecture} graph has no place for: "
                               f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    freqs = tensors.get("rope_freqs.weight")
    if freqs is not None and (freqs.type != "F32" or freqs.shape != (spec.head_size // 2,)):
        raise InvalidModelError(path, f"rope_freqs.weight is {freqs.type} {list(freqs.shape)}, "
                                      f"expected F32 [{spec.head_size // 2}]")
