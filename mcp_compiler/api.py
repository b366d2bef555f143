"""The library's entry points: what the CLI (and any other caller) uses."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import InvalidModelError, UsageError
from .frontend import load_onnx
from .ir.graph import Model
from .ir_schema import FILE_EXTENSION
from .mcpir import is_mcpir, read_mcpir, write_mcpir
from .summary import ModelSummary, summarize


@dataclass
class ConvertOptions:
    check: bool = True            # run onnx.checker on the input
    infer_shapes: bool = True     # run ONNX shape inference before import


@dataclass
class ConvertReport:
    input: str
    output: str
    nodes: int
    weights: int
    weight_bytes: int
    output_bytes: int
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def load_model(path: str | os.PathLike, *, check: bool = True, infer_shapes: bool = True) -> tuple[Model, str, list[str]]:
    """Load an ONNX or MCP-IR file: (model, format, warnings).

    A file is MCP-IR when it carries the identifier or is named *.mcpir (then a wrong identifier
    is reported as such, rather than as a failed ONNX parse).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError as e:
        raise InvalidModelError(path, f"cannot read: {e.strerror}") from None
    if is_mcpir(head) or path.suffix == FILE_EXTENSION:
        return read_mcpir(path), "mcpir", []
    loaded = load_onnx(path, check=check, infer_shapes=infer_shapes)
    return loaded.model, "onnx", loaded.warnings


def convert(input: str | os.PathLike, output: str | os.PathLike,
            options: ConvertOptions | None = None) -> ConvertReport:
    """ONNX -> `.mcpir`. The output is written atomically: a failure leaves nothing behind."""
    options = options or ConvertOptions()
    output = Path(output)
    if output.suffix != FILE_EXTENSION:
        raise UsageError(f"--output {output}: expected a {FILE_EXTENSION} file "
                         "(Triton repositories come with --target)")
    if output.is_dir():
        raise UsageError(f"--output {output} is a directory")
    if not output.parent.exists():
        raise UsageError(f"--output {output}: folder {output.parent} does not exist")
    t0 = time.perf_counter()
    loaded = load_onnx(input, check=options.check, infer_shapes=options.infer_shapes)
    t1 = time.perf_counter()
    stats = write_mcpir(loaded.model, output)
    t2 = time.perf_counter()
    s = summarize(loaded.model, "onnx")
    return ConvertReport(
        input=str(input), output=str(output), nodes=s.nodes, weights=s.weights,
        weight_bytes=s.weight_bytes, output_bytes=stats.file_bytes,
        seconds={"load": round(t1 - t0, 4), "write": round(t2 - t1, 4)},
        warnings=loaded.warnings)


def inspect(path: str | os.PathLike) -> ModelSummary:
    model, fmt, _ = load_model(path, check=False, infer_shapes=False)
    return summarize(model, fmt)
