"""Serving parameters for the Triton target: from flags and a YAML build file (flags win)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from mcp_compiler.errors import UsageError

from ..base import TargetParams

INT32_MAX = 2**31 - 1


@dataclass
class ServingParams(TargetParams):
    """What config.pbtxt says beyond the model's contract. None = not set (Triton's default)."""

    backend: str = "python"                  # python (MCP-IR + the bundled runtime) | onnxruntime | openvino
    # the python runtime's execution (mcp_compiler.profile): onnxruntime fp32, OpenVINO, or the
    # fastest this machine measures within the accuracy budget (auto); precision auto|f32|bf16
    runtime: str = "onnxruntime"
    precision: str = "auto"
    profile_seconds: int = 20                # the bound on auto's measurement
    dynamic_batch: bool | None = None        # None: on when the contract allows it, else a warning
    max_batch_size: int = 8
    preferred_batch_size: list[int] = field(default_factory=list)
    max_queue_delay_us: int | None = None
    max_concurrent_requests: int | None = None   # -> dynamic_batching queue size (requests beyond wait... rejected)
    inference_timeout_ms: int | None = None      # -> queue policy timeout, action REJECT
    instance_count: int = 1
    kind: str = "cpu"                             # cpu | gpu
    tensor_parallel_size: int = 1                 # gpu only: instances placed on GPUs 0..N-1
    prepack: bool = True                          # onnxruntime weight prepacking (off: faster load)
    dequantize_at_load: bool | None = None        # fold DequantizeLinear of weights at load (None: on for cpu)
    model_warmup: bool = False
    warmup_dims: dict[str, int] = field(default_factory=dict)   # symbol -> size for warm-up inputs
    # state pairs (mcp_compiler/state.py) kept on the server by Triton's sequence batcher
    stateful: bool | None = None                  # None: on when the model has state pairs
    state: list[str] = field(default_factory=list)   # "IN=OUT" pairs given: used instead of those found
    # oldest: many sequences interleave (the runtime keeps each one's state); direct with
    # max_batch_size 0 gives each instance one sequence slot, so a second one takes the first's
    sequence_strategy: str = "oldest"             # oldest | direct
    max_sequence_idle_us: int = 60_000_000        # a sequence idle this long loses its state
    max_sequences: int = 1024                     # sequences holding state at once, at most
    max_state_length: int = 4096                  # a growing (KV) state's length, at most
    # a decoder LLM: a decoupled generation entry (mcp_runtime.engine); max_concurrent_requests
    # is then the sequences run at once, inference_timeout_ms the longest wait in its queue
    generation: bool | None = None                # None: on for a decoder LLM
    kv_cache_bytes: int | None = None             # the KV-cache pool; None: 10% of the server's memory
    kv_block_size: int = 16                       # tokens a block of the pool holds
    prefix_caching: bool = True                   # full blocks reused by later prompts that start the same way
    prefill_chunk: int = 256                      # prompt tokens a step takes (a long prompt never stalls the streams)
    max_queue: int = 64                           # requests waiting for a slot; more are refused at once

    def validate(self, label: Callable[[str], str] = str) -> ServingParams:
        """Raises UsageError naming each setting by `label(key)` (the flag, or the build file's key)."""
        def positive(key: str, v: int | None, allow_zero: bool = False) -> None:
            name = label(key.split(".")[0]) + key[len(key.split(".")[0]):]
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1)):
                raise UsageError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer, got {v!r}")
            if v is not None and v > INT32_MAX:  # config.pbtxt's fields are int32
                raise UsageError(f"{name} must be at most {INT32_MAX}, got {v}")

        if self.backend not in ("python", "onnxruntime", "openvino"):
            raise UsageError(f"{label('backend')} must be python, onnxruntime or openvino, got {self.backend!r}")
        if self.runtime not in ("auto", "onnxruntime", "openvino"):
            raise UsageError(f"{label('runtime')} must be auto, onnxruntime or openvino, got {self.runtime!r}")
        if self.precision not in ("auto", "f32", "bf16"):
            raise UsageError(f"{label('precision')} must be auto, f32 or bf16, got {self.precision!r}")
        if self.runtime != "onnxruntime" and self.backend != "python":
            raise UsageError(f"{label('runtime')} picks the python runtime's execution; --backend {self.backend} is "
                             "Triton's own backend (--backend openvino serves with Triton's OpenVINO backend)")
        if self.runtime == "onnxruntime" and self.precision == "bf16" and self.backend != "openvino":
            raise UsageError(f"{label('precision')} bf16 runs on OpenVINO: --runtime openvino or auto")
        if not 1 <= self.profile_seconds <= 3600:
            raise UsageError(f"{label('profile_seconds')} must be between 1 and 3600, got {self.profile_seconds!r}")
        positive("max_batch_size", self.max_batch_size)
        positive("max_queue_delay_us", self.max_queue_delay_us, allow_zero=True)
        positive("max_concurrent_requests", self.max_concurrent_requests)
        positive("inference_timeout_ms", self.inference_timeout_ms)
        positive("instance_count", self.instance_count)
        positive("tensor_parallel_size", self.tensor_parallel_size)
        for b in self.preferred_batch_size:
            positive("preferred_batch_size", b)
            if b > self.max_batch_size:
                raise UsageError(f"{label('preferred_batch_size')} {b} exceeds {label('max_batch_size')} "
                                 f"{self.max_batch_size}")
        if self.kind not in ("cpu", "gpu"):
            raise UsageError(f"{label('kind')} must be cpu or gpu, got {self.kind!r}")
        if self.tensor_parallel_size > 1 and self.kind != "gpu":
            raise UsageError(f"{label('tensor_parallel_size')} > 1 needs {label('kind')}{'' if label('kind')[0] == '-' else ':'} gpu")
        for k, v in self.warmup_dims.items():
            positive(f"warmup_dims.{k}", v)
        positive("max_sequence_idle_us", self.max_sequence_idle_us)
        positive("max_sequences", self.max_sequences)
        positive("max_state_length", self.max_state_length)
        positive("kv_cache_bytes", self.kv_cache_bytes)
        positive("kv_block_size", self.kv_block_size)
        positive("prefill_chunk", self.prefill_chunk)
        positive("max_queue", self.max_queue, allow_zero=True)
        if self.sequence_strategy not in ("direct", "oldest"):
            raise UsageError(f"{label('sequence_strategy')} must be direct or oldest, got {self.sequence_strategy!r}")
        return self


_FIELDS = {f.name: f for f in fields(ServingParams)}
# The build file's keys: the serving parameters (the compiler's own keys, such as
# quantization_level, are read by the compiler: targets.base.COMPILER_SETTINGS).
OPTION_TYPES: dict[str, type] = {**{k: int for k in _FIELDS}, "backend": str, "runtime": str, "precision": str,
                                 "dynamic_batch": bool,
                                 "preferred_batch_size": list, "kind": str, "model_warmup": bool,
                                 "warmup_dims": dict, "prepack": bool, "dequantize_at_load": bool,
                                 "stateful": bool, "sequence_strategy": str, "state": list,
                                 "generation": bool, "prefix_caching": bool}
# The flag that sets each key on `convert`.
FLAGS = {k: "--" + k.replace("_", "-") for k in OPTION_TYPES}
FLAGS.update(model_warmup="--warmup")


def resolve(build_file: dict[str, Any], flags: dict[str, Any], source: str = "the build file") -> ServingParams:
    """Build-file values, then the flags the user gave (None = not given); a bad value is named
    by its flag, or by its key in `source`."""
    given = {k: v for k, v in flags.items() if v is not None}
    merged = {**build_file, **given}
    unknown = sorted(set(merged) - set(_FIELDS))
    if unknown:
        raise UsageError(f"unknown serving setting {unknown[0]!r} (known: {', '.join(_FIELDS)})")

    def label(key: str) -> str:
        return FLAGS.get(key, key) if key in given else key

    try:
        return ServingParams(**merged).validate(label)
    except UsageError as e:   # a build-file value: say which file
        if str(e).startswith("-"):
            raise
        raise UsageError(f"{source}: {e}") from None
