"""The runtime's parameters: the keys of an entry's config.pbtxt `parameters` that the served
model reads, with their types and defaults, in one place. mcp-cli's config builder writes them;
the runtime (model.py), verify, deploy, tune and kserve read them through `read`. Standard
library only: this module ships in every entry (mcp_runtime/params.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

RUNTIME = "mcp_runtime"                  # the model file the runtime loads, in the version folder
EXECUTION = "mcp_execution"              # onnxruntime | openvino | onnxruntime-cuda | onnxruntime-tensorrt
PRECISION = "mcp_precision"              # f32 | bf16 | f16
BUDGET = "mcp_budget"                    # JSON: the accuracy budget the execution was chosen within
INTRA_OP_THREADS = "intra_op_threads"    # onnxruntime's intra-op threads (0 or absent: its default)
PREPACK = "ort_prepack"                  # "false": no prepacked copies of the weights
DEQUANTIZE_AT_LOAD = "ort_dequantize_at_load"   # "true": QDQ weights dequantized once at load
QUANTIZATION_LEVEL = "quantization_level"       # none | int4 | fp8 | fp16 | bf16 (what convert did)
LAYOUTS = "mcp_layouts"                  # JSON: input/output -> the layout served (NHWC interface)
SCALARS = "mcp_scalars"                  # JSON: the rank-0 inputs and outputs, served as [1]
STATE = "mcp_state"                      # JSON: [[state input, next state output], ...] kept on the server
MAX_SEQUENCES = "mcp_max_sequences"      # the sequences whose state is kept at once
REQUEST = "mcp_request"                  # JSON: a request the model accepts, for clients with the config only
GENERATION = "mcp_generation"            # JSON: a decoder LLM served as a generation entry (GENERATION_DEFAULTS)

# a generation entry's settings: the KV-cache pool (bytes, tokens a block), the sequences run at
# once and waiting, prefix reuse, the prompt tokens a step takes, the queue timeout (0: none)
GENERATION_DEFAULTS = {"kv_cache_bytes": 0, "kv_cache_fraction": 0.1, "block_size": 16, "max_running": 8,
                       "max_queue": 64, "prefix_caching": True, "prefill_chunk": 256, "queue_timeout_ms": 0}


@dataclass(frozen=True)
class Params:
    runtime: str = "model.mcpir"
    execution: str = "onnxruntime"
    precision: str = "f32"
    budget: dict | None = None
    intra_op_threads: int = 0
    prepack: bool = True
    dequantize_at_load: bool = False
    quantization_level: str = "none"
    layouts: dict = field(default_factory=dict)
    scalars: list = field(default_factory=list)
    state: list = field(default_factory=list)
    max_sequences: int = 1024
    request: dict = field(default_factory=dict)   # input -> {"shape": [...], "values": [kind, ...]}
    generation: dict | None = None                # a generation entry's settings (GENERATION_DEFAULTS' keys)


def read(parameters: Mapping[str, str]) -> Params:
    """The typed parameters from config.pbtxt's string values (key -> string_value); a value that
    does not parse is a ValueError naming its key."""
    def get(key: str, default: str) -> str:
        v = parameters.get(key)
        return default if v is None or v == "" else v

    def number(key: str, default: int) -> int:
        text = get(key, str(default)).strip()
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"parameter {key}: {text[:40]!r} is not a whole number")
        return int(text)

    def loaded(key: str, default: str):  # noqa: ANN202 - the JSON value
        text = get(key, default)
        if len(text) > 1 << 20:
            raise ValueError(f"parameter {key}: {len(text):,} characters (at most {1 << 20:,})")
        try:
            return json.loads(text)
        except (ValueError, RecursionError):   # 50,000 nested brackets: a RecursionError, as bad as garbage
            raise ValueError(f"parameter {key}: not JSON") from None

    return Params(runtime=get(RUNTIME, "model.mcpir"), execution=get(EXECUTION, "onnxruntime"),
                  precision=get(PRECISION, "f32"), budget=loaded(BUDGET, "null"),
                  intra_op_threads=number(INTRA_OP_THREADS, 0),
                  prepack=get(PREPACK, "true").lower() != "false",
                  dequantize_at_load=get(DEQUANTIZE_AT_LOAD, "false").lower() == "true",
                  quantization_level=get(QUANTIZATION_LEVEL, "none"), layouts=loaded(LAYOUTS, "{}"),
                  scalars=loaded(SCALARS, "[]"), state=loaded(STATE, "[]"),
                  max_sequences=number(MAX_SEQUENCES, 1024), request=loaded(REQUEST, "{}"),
                  generation=_generation(loaded(GENERATION, "null")))


def _generation(d: object) -> dict | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise ValueError(f"parameter {GENERATION}: not a JSON object")
    out = dict(GENERATION_DEFAULTS)
    for k, v in d.items():
        if k not in out:
            raise ValueError(f"parameter {GENERATION}: unknown key {k!r}")
        want = type(out[k])
        ok = isinstance(v, bool) if want is bool else (isinstance(v, (int, float)) and not isinstance(v, bool)
                                                        and v >= 0 and (want is float or float(v).is_integer()))
        if not ok or (want is float and not 0 < v <= 1):
            raise ValueError(f"parameter {GENERATION}: {k} = {v!r} is not a valid {want.__name__}")
        out[k] = want(v)
    for k in ("block_size", "max_running", "prefill_chunk"):
        if out[k] < 1:
            raise ValueError(f"parameter {GENERATION}: {k} must be at least 1")
    return out


def of_config(cfg) -> Params:  # noqa: ANN001 - a ModelConfig protobuf
    """read() of a parsed ModelConfig."""
    return read({k: v.string_value for k, v in cfg.parameters.items()})
