"""Serving parameters for the Triton target: from flags and a YAML build file (flags win)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mcp_compiler.errors import UsageError

QUANTIZATION_LEVELS = ("none", "fp8", "int4")
INT32_MAX = 2**31 - 1


@dataclass
class ServingParams:
    """What config.pbtxt says beyond the model's contract. None = not set (Triton's default)."""

    dynamic_batch: bool | None = None        # None: on when the contract allows it, else a warning
    max_batch_size: int = 8
    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_delay_us: int | None = None
    max_concurrent_requests: int | None = None   # -> dynamic_batching queue size (requests beyond wait... rejected)
    inference_timeout_ms: int | None = None      # -> queue policy timeout, action REJECT
    instance_count: int = 1
    kind: str = "cpu"                             # cpu | gpu
    tensor_parallel_size: int = 1                 # gpu only: instances placed on GPUs 0..N-1
    quantization_level: str = "none"
    prepack: bool = True                          # onnxruntime weight prepacking (off: faster load)
    model_warmup: bool = False
    warmup_dims: dict[str, int] = field(default_factory=dict)   # symbol -> size for warm-up inputs

    def validate(self) -> ServingParams:
        def positive(name: str, v: int | None, allow_zero: bool = False) -> None:
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1)):
                raise UsageError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer, got {v!r}")
            if v is not None and v > INT32_MAX:  # config.pbtxt's fields are int32
                raise UsageError(f"{name} must be at most {INT32_MAX}, got {v}")

        positive("max_batch_size", self.max_batch_size)
        positive("max_queue_delay_us", self.max_queue_delay_us, allow_zero=True)
        positive("max_concurrent_requests", self.max_concurrent_requests)
        positive("inference_timeout_ms", self.inference_timeout_ms)
        positive("instance_count", self.instance_count)
        positive("tensor_parallel_size", self.tensor_parallel_size)
        for b in self.preferred_batch_size:
            positive("preferred_batch_size", b)
            if b > self.max_batch_size:
                raise UsageError(f"preferred_batch_size {b} exceeds max_batch_size {self.max_batch_size}")
        if self.kind not in ("cpu", "gpu"):
            raise UsageError(f"kind must be cpu or gpu, got {self.kind!r}")
        if self.tensor_parallel_size > 1 and self.kind != "gpu":
            raise UsageError("tensor_parallel_size > 1 needs kind: gpu")
        if self.quantization_level not in QUANTIZATION_LEVELS:
            raise UsageError(f"quantization_level must be one of {', '.join(QUANTIZATION_LEVELS)}, "
                             f"got {self.quantization_level!r}")
        for k, v in self.warmup_dims.items():
            positive(f"warmup_dims.{k}", v)
        return self


_FIELDS = {f.name: f for f in fields(ServingParams)}


def load_build_file(path: Path) -> dict[str, Any]:
    """The `serving:` keys of a YAML build file (mcp.yaml); unknown keys are errors."""
    from mcp_compiler.files import parse_yaml, read_config

    text = read_config(path, "--config")
    data = parse_yaml(text, f"--config {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of settings at the top")
    lines = {k: i + 1 for i, ln in enumerate(text.splitlines())
             for k in [ln.split(":", 1)[0].strip()] if ":" in ln}
    for key, value in data.items():
        if key not in _FIELDS:
            raise UsageError(f"--config {path} line {lines.get(key, '?')}: unknown key {key!r} "
                             f"(known: {', '.join(_FIELDS)})")
        _check_type(path, lines.get(key, "?"), key, value)
    return data


def _check_type(path: Path, line: object, key: str, value: Any) -> None:
    expected = {"dynamic_batch": bool, "preferred_batch_size": list, "kind": str,
                "quantization_level": str, "model_warmup": bool, "warmup_dims": dict,
                "prepack": bool}.get(key, int)
    ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
    if key == "dynamic_batch" and value is None:
        ok = True
    if not ok:
        raise UsageError(f"--config {path} line {line}: {key} must be a {expected.__name__}, got {value!r}")


def resolve(build_file: dict[str, Any], flags: dict[str, Any]) -> ServingParams:
    """Build-file values, then the flags the user gave (None = not given)."""
    merged = {**build_file, **{k: v for k, v in flags.items() if v is not None}}
    return ServingParams(**merged).validate()
