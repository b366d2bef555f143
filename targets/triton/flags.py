"""The Triton target's own `convert` flags (the "Target: serving" help panel) and the settings
they make: the build file's keys, merged with it by params.resolve."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

PANEL = "Target: serving (triton-v1.12)"


def convert_flags() -> list:
    import typer

    from ..base import ConvertFlag

    def flag(name: str, annotation: Any, default: Any, *decls: str, help: str, **kw: Any) -> ConvertFlag:
        return ConvertFlag(name, annotation, typer.Option(default, *decls, rich_help_panel=PANEL, help=help, **kw))

    return [
        flag("backend", Optional[str], None, "--backend", metavar="python|onnxruntime|openvino",
             help="python (MCP-IR + the bundled runtime; default), onnxruntime or openvino (Triton's own "
                  "onnxruntime or OpenVINO backend, in NVIDIA's stock image)."),
        flag("runtime", Optional[str], None, "--runtime", metavar="onnxruntime|openvino|auto",
             help="What the python runtime executes with: onnxruntime (default), openvino, or auto: the "
                  "fastest this machine measures within the accuracy budget (the profile is in the report)."),
        flag("precision", Optional[str], None, "--precision", metavar="auto|f32|bf16",
             help="With --runtime openvino or auto: f32, bf16 (AMX / AVX512_BF16), or auto (measured)."),
        flag("profile_seconds", Optional[int], None, "--profile-seconds",
             help="The bound on --runtime auto's measurement, loading and compiling included (default 20)."),
        flag("dynamic_batch", Optional[str], None, "--dynamic-batch", metavar="true|false|auto",
             help="auto (default): on when every input and output has the same batch symbol at axis 0; "
                  "true makes that a requirement."),
        flag("no_dynamic_batch", bool, False, "--no-dynamic-batch", help="Same as --dynamic-batch false."),
        flag("no_state", bool, False, "--no-state", help="Serve a model with state pairs stateless (the client "
             "sends and receives the state); default: the state kept on the server (sequence batcher)."),
        flag("state", Optional[list[str]], None, "--state", metavar="INPUT=OUTPUT",
             help="A state pair to keep on the server (repeatable; replaces the pairs found, see `inspect`)."),
        flag("sequence_strategy", Optional[str], None, "--sequence-strategy", metavar="direct|oldest",
             help="The sequence batcher's strategy for a stateful model (default oldest: sequences "
                  "interleave; direct: one sequence per instance at a time)."),
        flag("max_batch_size", Optional[int], None, "--max-batch-size", help="Largest batch Triton forms (default 8)."),
        flag("preferred_batch_size", Optional[str], None, "--preferred-batch-size", metavar="N[,N...]",
             help="Batch sizes the dynamic batcher waits to form."),
        flag("max_queue_delay_us", Optional[int], None, "--max-queue-delay-us", help="How long the batcher may "
             "hold a request to form a preferred batch (microseconds)."),
        flag("max_concurrent_requests", Optional[int], None, "--max-concurrent-requests", help="Bound on queued "
             "requests (dynamic batching queue size); more are rejected."),
        flag("inference_timeout_ms", Optional[int], None, "--inference-timeout-ms", help="Queue timeout; "
             "requests waiting longer are rejected."),
        flag("instance_count", Optional[int], None, "--instance-count", help="Model instances per device (default 1)."),
        flag("kind", Optional[str], None, "--kind", metavar="cpu|gpu", help="Where instances run (default cpu)."),
        flag("tensor_parallel_size", Optional[int], None, "--tensor-parallel-size", help="gpu: place instances "
             "on GPUs 0..N-1 (default 1)."),
        flag("model_warmup", Optional[bool], None, "--warmup/--no-warmup", help="Add a model_warmup built from "
             "the contract."),
        flag("warmup_dims", Optional[str], None, "--warmup-dims", metavar="NAME=SIZE[,...]",
             help="Symbol sizes for the warm-up inputs, e.g. H=64,W=64."),
        flag("prepack", Optional[bool], None, "--prepack/--no-prepack", help="onnxruntime weight prepacking in "
             "the served model (--no-prepack: load in milliseconds from the mapped weights, no packed copy "
             "in memory)."),
        flag("dequantize_at_load", Optional[bool], None, "--dequantize-at-load/--no-dequantize-at-load",
             help="fp8/int4-qdq weights dequantized once when the served model loads (float32 in memory, "
                  "float32 speed; the files stay small). Default: on for --kind cpu, whose onnxruntime "
                  "kernels would dequantize them on every request."),
        flag("generation", Optional[bool], None, "--generation/--no-generation",
             help="A decoder LLM as a streaming generation entry (default; decoupled: gRPC streams, one response "
                  "a token) or, --no-generation, as its raw decoder step (the KV cache in the request)."),
        flag("kv_cache_bytes", Optional[str], None, "--kv-cache-bytes", metavar="BYTES",
             help="LLM: the KV-cache pool made at load, e.g. 512MiB, 2GB (default: a tenth of the server's memory)."),
        flag("kv_block_size", Optional[int], None, "--kv-block-size", help="LLM: tokens a block of the pool holds "
             "(default 16; prefixes are reused a block at a time)."),
        flag("prefix_caching", Optional[bool], None, "--prefix-caching/--no-prefix-caching",
             help="LLM: reuse the cached blocks of prompts that start the same way (default on)."),
        flag("prefill_chunk", Optional[int], None, "--prefill-chunk", help="LLM: prompt tokens one step takes "
             "(default 256): a long prompt is run in chunks beside the running streams."),
        flag("max_queue", Optional[int], None, "--max-queue", help="LLM: requests waiting for a free slot "
             "(default 64); more are refused at once with a busy error."),
    ]


# flags whose value is the setting as it is
_PLAIN = ("profile_seconds", "max_batch_size", "max_queue_delay_us", "max_concurrent_requests", "inference_timeout_ms",
          "instance_count", "tensor_parallel_size", "model_warmup", "prepack", "dequantize_at_load", "generation",
          "kv_block_size", "prefix_caching", "prefill_chunk", "max_queue")


def settings_from_flags(f: Mapping[str, Any]) -> dict[str, Any]:
    """The build-file keys the flags given set (a flag not given sets nothing)."""
    from mcp_compiler.cli.common import parse_dims, parse_ints, tri_state

    def lower(v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    given = {k: f[k] for k in _PLAIN if f.get(k) is not None}
    given.update({k: v for k, v in (
        ("backend", lower(f.get("backend"))),
        ("runtime", lower(f.get("runtime"))),
        ("precision", lower(f.get("precision"))),
        ("dynamic_batch", False if f.get("no_dynamic_batch") else tri_state(lower(f.get("dynamic_batch")),
                                                                          "--dynamic-batch")),
        ("preferred_batch_size", parse_ints(f.get("preferred_batch_size"), "--preferred-batch-size")),
        ("kind", lower(f.get("kind"))),
        ("stateful", False if f.get("no_state") else None),
        ("state", list(f["state"]) if f.get("state") else None),
        ("sequence_strategy", lower(f.get("sequence_strategy"))),
        ("warmup_dims", parse_dims(f["warmup_dims"], "--warmup-dims") if f.get("warmup_dims") else None),
        ("kv_cache_bytes", parse_bytes(f["kv_cache_bytes"], "--kv-cache-bytes") if f.get("kv_cache_bytes") else None),
    ) if v is not None})
    return given


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(text: str, flag: str) -> int:
    """'512MiB', '2GB', '1000000' -> bytes; a UsageError naming the flag otherwise."""
    import re

    from mcp_compiler.errors import UsageError

    m = re.fullmatch(r"\s*(\d{1,15})\s*([a-zA-Z]{0,3})\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS or int(m.group(1)) == 0:
        raise UsageError(f"{flag}: {str(text)[:40]!r} is not a size in bytes (e.g. 512MiB, 2GB, 1000000)")
    return int(m.group(1)) * _UNITS[unit]
