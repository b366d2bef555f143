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
        try:
            return json.loads(get(key, default))
        except ValueError:
            raise ValueError(f"parameter {key}: not JSON") from None

    return Params(runtime=get(RUNTIME, "model.mcpir"), execution=get(EXECUTION, "onnxruntime"),
                  precision=get(PRECISION, "f32"), budget=loaded(BUDGET, "null"),
                  intra_op_threads=number(INTRA_OP_THREADS, 0),
                  prepack=get(PREPACK, "true").lower() != "false",
                  dequantize_at_load=get(DEQUANTIZE_AT_LOAD, "false").lower() == "true",
                  quantization_level=get(QUANTIZATION_LEVEL, "none"), layouts=loaded(LAYOUTS, "{}"),
                  scalars=loaded(SCALARS, "[]"), state=loaded(STATE, "[]"),
                  max_sequences=number(MAX_SEQUENCES, 1024), request=loaded(REQUEST, "{}"))


def of_config(cfg) -> Params:  # noqa: ANN001 - a ModelConfig protobuf
    """read() of a parsed ModelConfig."""
    return read({k: v.string_value for k, v in cfg.parameters.items()})
