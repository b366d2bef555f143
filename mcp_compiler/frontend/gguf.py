"""GGUF -> IR: the decoder built as an ONNX graph (mcp_compiler.llm.build), then imported as any ONNX."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx

from ..llm import build
from ..llm.gguf_file import read_gguf
from ..llm.spec import GENERATION_KEY, LLM_KEY, TOKENIZER_KEY, spec_json
from ..llm.tokenizer import from_gguf
from .onnx import LoadedModel, load_onnx


def gguf_decoder(path: str | os.PathLike, *, last_logits: bool, dequantized: bool = False,
                 accuracy_level: int = build.ACCURACY_FLOAT, fused: bool = True) -> onnx.ModelProto:
    """The GGUF's decoder as an ONNX model, its tokenizer and description in the metadata
    (fused: onnxruntime's fused ops and GroupQueryAttention's packed cache; else Optimum's plain
    graph, as torch exports it)."""
    gm = read_gguf(path)
    tok = from_gguf(gm.metadata, gm.path)
    proto = build.build_decoder(gm, dequantized=dequantized, last_logits=last_logits, accuracy_level=accuracy_level,
                                fused=fused)
    source = {"format": "gguf", "file": gm.path.name, "bytes": gm.file_bytes,
              "types": sorted({t.type for t in gm.tensors.values()}),
              "weights": "float32 (dequantized)" if dequantized else "GGUF blocks as 4-bit MatMulNBits",
              "accuracy_level": accuracy_level}
    meta = {LLM_KEY: spec_json(gm.spec, source, "packed" if fused else "padded"), TOKENIZER_KEY: tok.tokenizer_json, GENERATION_KEY: tok.to_json()}
    for k, v in meta.items():
        proto.metadata_props.add(key=k, value=v)
    return proto


def load_gguf(path: str | os.PathLike, *, check: bool = True, infer_shapes: bool = True,
              last_logits: bool = True) -> LoadedModel:
    """Read and check the GGUF (every refusal before any work), build its decoder, import it."""
    path = Path(path)
    proto = gguf_decoder(path, last_logits=last_logits)
    with tempfile.TemporaryDirectory(prefix="mcp-gguf-") as d:
        tmp = Path(d) / (path.stem + ".onnx")
        tmp.write_bytes(proto.SerializeToString())
        del proto
        loaded = load_onnx(tmp, check=check, infer_shapes=infer_shapes)
    loaded.path = path
    return loaded
