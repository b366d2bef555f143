"""The model contract -> Triton's ModelConfig (protobuf from tritonclient; never string building)."""

from __future__ import annotations

import json
import sys

import numpy as np
from google.protobuf import text_format

from mcp_compiler.errors import UnsupportedError, UsageError
from mcp_compiler.ir import DataType, Layout, Model, TensorType, Value
from mcp_compiler.names import check_name, sanitize_name  # noqa: F401 - re-exported for the emitter

from ..base import Note
from .params import ServingParams
from .runtime import params as P


def _model_config_pb2():  # noqa: ANN202 - the generated module
    """tritonclient's generated ModelConfig protos, loaded without `tritonclient.grpc`'s own
    __init__, which imports grpc and the client (25 ms of each convert, none of it used here).
    It is registered under its own name: a later `from tritonclient.grpc import model_config_pb2`
    gets this module (a protobuf file may be registered once)."""
    import importlib.util
    from pathlib import Path

    name = "tritonclient.grpc.model_config_pb2"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("tritonclient")
    if package is None or not package.submodule_search_locations:
        raise ImportError("tritonclient is not installed")
    spec = importlib.util.spec_from_file_location(
        name, Path(package.submodule_search_locations[0]) / "grpc" / "model_config_pb2.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


mc = _model_config_pb2()

# ONNX element type -> Triton data type. Triton has no FP8/INT4 tensors: quantized models keep
# FP32/FP16/BF16 at their interface.
TRITON_DTYPES = {
    DataType.BOOL: mc.TYPE_BOOL, DataType.UINT8: mc.TYPE_UINT8, DataType.UINT16: mc.TYPE_UINT16,
    DataType.UINT32: mc.TYPE_UINT32, DataType.UINT64: mc.TYPE_UINT64, DataType.INT8: mc.TYPE_INT8,
    DataType.INT16: mc.TYPE_INT16, DataType.INT32: mc.TYPE_INT32, DataType.INT64: mc.TYPE_INT64,
    DataType.FLOAT16: mc.TYPE_FP16, DataType.FLOAT: mc.TYPE_FP32, DataType.DOUBLE: mc.TYPE_FP64,
    DataType.STRING: mc.TYPE_STRING, DataType.BFLOAT16: mc.TYPE_BF16,
}

def interface(model: Model) -> tuple[list[Value], list[Value]]:
    inputs = [v for v in model.graph.inputs if v.const is None]
    return inputs, list(model.graph.outputs)


SCALAR_BLOCKER = "is a scalar (rank 0), which has no batch axis"


def batch_blocker(model: Model) -> str | None:
    """Why dynamic batching is impossible (naming the value), or None when every input and
    output has the same symbol at axis 0."""
    inputs, outputs = interface(model)
    values = [("input", x) for x in inputs] + [("output", x) for x in outputs]
    for kind, v in values:
        t = v.type
        if not isinstance(t, TensorType) or t.shape is None:
            return f"{kind} {v.name!r} has no known rank"
        if not t.shape:
            return f"{kind} {v.name!r} {SCALAR_BLOCKER}"
    first = inputs[0].type.shape[0] if inputs else None
    batch = first if isinstance(first, str) else None
    for kind, v in values:
        d0 = v.type.shape[0]
        if batch is not None and d0 == batch:
            continue
        what = repr(d0) if isinstance(d0, str) else (str(d0) if d0 is not None else "an unknown dim")
        if batch is None:
            return f"{kind} {v.name!r} has {what} at axis 0, not a batch symbol"
        where = next((i for i, d in enumerate(v.type.shape) if d == batch), None)
        extra = f"; its batch {batch!r} is at axis {where}" if where is not None else ""
        return f"{kind} {v.name!r} has {what} at axis 0, not the batch symbol {batch!r}{extra}"
    return None


def _tensor_config(v: Value, batched: bool, cls, ties: dict[str, int] | None = None):  # noqa: ANN001, ANN202
    t = v.type
    if not isinstance(t, TensorType) or t.sparse:
        raise UnsupportedError(f"model interface value {v.name!r} is {t}, Triton serves tensors only")
    if t.elem_type not in TRITON_DTYPES:
        raise UnsupportedError(f"model interface value {v.name!r} has element type "
                               f"{DataType(t.elem_type).name}, which Triton cannot carry")
    if t.shape is None:
        raise UnsupportedError(f"model interface value {v.name!r} has unknown rank; Triton needs dims")
    shape = t.shape[1:] if batched else t.shape
    if len(shape) == 0:
        # Triton has no scalars in a model without batching: one travels as [1], and the
        # runtime gives the model [] (the `mcp_scalars` parameter names them). A [batch] value
        # of a batching model travels as [batch, 1]: the config's reshape gives the model [batch].
        c = cls(name=v.name, data_type=TRITON_DTYPES[t.elem_type], dims=[1])
        if batched:
            c.reshape.SetInParent()
        return c
    # a symbol an op ties to a constant is that size: Triton then refuses another with its own message
    ties = ties or {}
    return cls(name=v.name, data_type=TRITON_DTYPES[t.elem_type],
               dims=[d if isinstance(d, int) else ties.get(d, -1) if isinstance(d, str) else -1 for d in shape])


def build_config(model: Model, name: str, backend: str, p: ServingParams,
                 quantization: str = "none") -> tuple[mc.ModelConfig, list[str], dict[str, bytes]]:
    """The ModelConfig for `model`, the warnings it raised, and the files it refers to (warm-up
    data, relative to the model's folder)."""
    warnings: list[str] = []
    gen = _generation_config(model, name, backend, p, quantization, warnings)
    if gen is not None:
        return gen, warnings, {}
    state = _state_pairs(model, backend, p, warnings)
    blocker = batch_blocker(model)
    batched = False
    if state:   # Triton's sequence batcher serves it: one request per step of a sequence
        if p.dynamic_batch:
            raise UsageError("--dynamic-batch: a stateful model is served by the sequence batcher (--no-state "
                             "serves it stateless with dynamic batching)")
    elif p.dynamic_batch is True and blocker:
        raise UsageError(f"--dynamic-batch: cannot batch this model: {blocker}")
    elif p.dynamic_batch is not False:
        if blocker and blocker.endswith(SCALAR_BLOCKER):   # no problem, the scalar's own note says how it travels
            warnings.append(Note(f"dynamic batching off (max_batch_size 0): {blocker}"))
        elif blocker:
            warnings.append(f"dynamic batching off (max_batch_size 0): {blocker}")
        else:
            batched = True
    cfg = mc.ModelConfig(name=name)
    if backend == "python":
        cfg.backend = "python"
    elif backend == "openvino":
        # Triton's OpenVINO backend (NVIDIA's stock image) reads the ONNX file itself
        cfg.backend = "openvino"
        cfg.default_model_filename = "model.onnx"
        warnings.append("backend openvino: Triton servers built with the OpenVINO backend (NVIDIA's tritonserver "
                        "containers) serve this entry; the local `mcp-cli serve` has only the python backend "
                        "(--backend python --runtime openvino runs OpenVINO there)")
    else:
        cfg.platform = "onnxruntime_onnx"
        cfg.backend = "onnxruntime"
        warnings.append("backend onnxruntime: Triton servers built with the onnxruntime backend (NVIDIA's "
                        "tritonserver containers) serve this entry; the local `mcp-cli serve` (PyPI's "
                        "tritonserver) has only the python backend and cannot load it (--backend python can)")
    cfg.max_batch_size = p.max_batch_size if batched else 0
    inputs, outputs = interface(model)
    if state:   # the state stays on the server: not part of the served interface
        kept = {x["input"] for x in state} | {x["output"] for x in state}
        inputs, outputs = [v for v in inputs if v.name not in kept], [v for v in outputs if v.name not in kept]
    ties = getattr(model, "shape_ties", None) or {}
    cfg.input.extend(_tensor_config(v, batched, mc.ModelInput, ties) for v in inputs)
    cfg.output.extend(_tensor_config(v, batched, mc.ModelOutput, ties) for v in outputs)
    if batched:
        db = cfg.dynamic_batching
        db.SetInParent()
        db.preferred_batch_size.extend(p.preferred_batch_size)
        if p.max_queue_delay_us is not None:
            db.max_queue_delay_microseconds = p.max_queue_delay_us
        _queue_policy(db.default_queue_policy, p)
    elif state:
        _sequence_batching(cfg.sequence_batching, p)
    if not batched and (p.max_concurrent_requests is not None or p.inference_timeout_ms is not None):
        # Without dynamic batching Triton still queues requests in its sequence of one.
        warnings.append("max_concurrent_requests / inference_timeout_ms need dynamic batching; "
                        "set on the queue of a batching model only")
    group = cfg.instance_group.add(count=p.instance_count,
                                   kind=mc.ModelInstanceGroup.KIND_GPU if p.kind == "gpu"
                                   else mc.ModelInstanceGroup.KIND_CPU)
    if p.kind == "gpu" and p.tensor_parallel_size > 1:
        # Triton cannot split one model across GPUs by itself: this places `count` instances on
        # each of GPUs 0..N-1; the backend receives tensor_parallel_size as a parameter.
        group.gpus.extend(range(p.tensor_parallel_size))
    params = {P.QUANTIZATION_LEVEL: quantization,
              "tensor_parallel_size": str(p.tensor_parallel_size)}
    layouts = {v.name: Layout(v.layout).name for v in [*inputs, *outputs] if v.layout != Layout.NONE}
    if layouts:
        # the interface values whose layout differs from the original's (layout-nhwc); `mcp-cli
        # verify` transposes those, and feeds an input that was NHWC already as it is
        changed = {v.name: Layout(v.layout).name for v in [*inputs, *outputs] if v.layout != Layout.NONE
                   and v.metadata_props.get("mcp:original_layout") != Layout(v.layout).name}
        params[P.LAYOUTS] = json.dumps(changed, sort_keys=True)
        for c in cfg.input:
            if len(c.dims) != 3:   # Triton takes a format only on [C,H,W]-ranked (batched) dims
                continue
            if layouts.get(c.name) == "NHWC":
                c.format = mc.ModelInput.FORMAT_NHWC
            elif layouts.get(c.name) == "NCHW":
                c.format = mc.ModelInput.FORMAT_NCHW
    scalars = [v.name for v in [*inputs, *outputs] if isinstance(v.type, TensorType)
               and v.type.shape is not None and len(v.type.shape) == 0]
    if scalars:
        if backend != "python":
            raise UnsupportedError(f"interface value {scalars[0]!r} is a scalar: Triton carries it as [1], and "
                                   "only the python backend's runtime reshapes it for the model",
                                   hint="use --backend python")
        params[P.SCALARS] = json.dumps(scalars)
        warnings.append(Note(f"{', '.join(repr(n) for n in scalars)} {'is a scalar' if len(scalars) == 1 else 'are scalars'} "
                             "(rank 0): Triton has no rank-0 tensors, so the entry declares dims [1]; clients "
                             "send (and get) a one-element array and the runtime hands the model [] (bench, "
                             "deploy's smoke test and verify send it so too)"))
    if backend == "openvino":
        params.update({"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"})
        if p.precision == "bf16":
            params["HINT_BF16"] = "YES"
    if backend == "python":
        params[P.RUNTIME] = "model.mcpir"
        if p.runtime == "openvino" and p.precision in ("f32", "bf16"):   # fixed by the user; auto: emit's profile
            params[P.EXECUTION], params[P.PRECISION] = "openvino", p.precision
        params[P.PREPACK] = "true" if p.prepack else "false"
        if _dequantizes_weights(model) and (p.dequantize_at_load or p.dequantize_at_load is None and p.kind == "cpu"):
            params[P.DEQUANTIZE_AT_LOAD] = "true"
            if p.dequantize_at_load is None:
                warnings.append("the served model dequantizes its quantized weights once at load (float32 in "
                                "memory; onnxruntime's CPU kernels would dequantize them on every request); "
                                "--no-dequantize-at-load keeps them quantized in memory")
    elif p.dequantize_at_load:
        warnings.append("dequantize_at_load applies to the python backend only (Triton's onnxruntime backend "
                        "takes no session configuration)")
    if state:
        params[P.STATE] = json.dumps(state)
        params[P.MAX_SEQUENCES] = str(p.max_sequences)
        warnings.append(Note(f"stateful: {', '.join(x['input'] + '->' + x['output'] for x in state)} kept on the server "
                        f"per sequence ({p.sequence_strategy} sequence batcher; clients send a sequence ID with "
                        "START/END and only the other inputs; --no-state serves it stateless)"))
        if p.model_warmup:
            warnings.append("model_warmup is not run for a stateful entry (a warm-up request has no sequence)")
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    files = _warmup(cfg, model, batched, p) if p.model_warmup and not state else {}
    return cfg, warnings, files


def _generation_config(model: Model, name: str, backend: str, p: ServingParams, quantization: str,
                       warnings: list[str]) -> mc.ModelConfig | None:
    """A decoder LLM's generation entry: a decoupled python model that streams a response a token
    (mcp_runtime.engine behind runtime/llm_model.py); None for any other model, or --no-generation."""
    from mcp_compiler.llm.spec import find_llm

    llm = None if p.generation is False else find_llm(model)
    if llm is None:
        return None
    if llm.kv_layout != "packed":   # Optimum's plain graphs: present = past + new, no cache to write in place
        why = ("its attention is not GroupQueryAttention (the generation entry keeps the cache in place, as "
               "GroupQueryAttention's shared buffer does; Optimum's plain export concatenates it)")
        if p.generation:
            raise UsageError(f"--generation: {why}; --no-generation serves its raw step, or convert the GGUF")
        warnings.append(f"a decoder LLM served as its raw step (the KV cache in the request), not a streaming "
                        f"generation entry: {why}")
        return None
    if backend != "python":
        if p.generation:
            raise UsageError(f"--generation: a generation entry runs on the python backend, not {backend}")
        return None
    if p.stateful or p.state or p.dynamic_batch:
        raise UsageError("a decoder LLM's generation entry keeps its KV cache itself (--no-generation serves its raw "
                         "step, with the cache in the request)")
    cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=0)
    cfg.model_transaction_policy.decoupled = True
    for n, t, dims in (("text_input", mc.TYPE_STRING, [1]), ("messages", mc.TYPE_STRING, [1]),
                       ("input_ids", mc.TYPE_INT64, [-1]), ("sampling_parameters", mc.TYPE_STRING, [1])):
        cfg.input.add(name=n, data_type=t, dims=dims, optional=True)
    for n, t, dims in (("text_output", mc.TYPE_STRING, [1]), ("token_ids", mc.TYPE_INT64, [-1]),
                       ("finish_reason", mc.TYPE_STRING, [1]), ("usage", mc.TYPE_STRING, [1])):
        cfg.output.add(name=n, data_type=t, dims=dims)
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    if p.instance_count != 1 or p.kind != "cpu":
        warnings.append("a generation entry runs one instance on the CPU (its engine batches the streams itself)")
    gen = dict(P.GENERATION_DEFAULTS, block_size=p.kv_block_size, prefix_caching=p.prefix_caching,
               prefill_chunk=p.prefill_chunk, max_queue=p.max_queue)
    if p.kv_cache_bytes is not None:
        gen["kv_cache_bytes"] = p.kv_cache_bytes
    if p.max_concurrent_requests is not None:
        gen["max_running"] = p.max_concurrent_requests
    if p.inference_timeout_ms is not None:
        gen["queue_timeout_ms"] = p.inference_timeout_ms
    params = {P.QUANTIZATION_LEVEL: quantization, P.RUNTIME: "model.mcpir", P.PREPACK: "true" if p.prepack else "false",
              P.GENERATION: json.dumps(gen, sort_keys=True)}
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    per_token = llm.cache_bytes_per_token
    if gen["kv_cache_bytes"] and per_token:
        from .runtime.engine import slot_tokens

        tokens = slot_tokens(gen["kv_cache_bytes"], gen["max_running"], gen["block_size"], per_token,
                             llm.context or 1 << 30)
        if tokens < gen["block_size"]:
            raise UsageError(f"--kv-cache-bytes {gen['kv_cache_bytes']}: holds no block of {gen['block_size']} tokens "
                             f"for each of {gen['max_running']} sequences ({per_token:,} bytes a token)")
        pool = (f"KV-cache pool {gen['kv_cache_bytes'] / 2**20:.0f} MiB: {gen['max_running']} slots of {tokens:,} "
                f"tokens (prompt + max_tokens of a request at most) at {per_token:,} bytes a token")
    else:
        pool = (f"KV-cache pool: a tenth of the server's memory at load ({per_token:,} bytes a token; "
                "--kv-cache-bytes fixes it)" if per_token else "KV-cache pool: a tenth of the server's memory at load")
    warnings.append(Note(f"a decoder LLM: served as a streaming generation entry (decoupled; gRPC streams, "
                         f"`mcp-cli generate`, `serve --openai-port`), up to {gen['max_running']} sequences at once; "
                         f"{pool}; --no-generation serves its raw step"))
    return cfg


def _state_pairs(model: Model, backend: str, p: ServingParams, warnings: list[str]) -> list[dict]:
    """The state pairs this entry keeps on the server: [{input, output, dtype, shape}] (static
    shapes; a KV cache that grows, or a shape with symbols, stays with the client, said so)."""
    if p.stateful is False:
        if p.state:
            raise UsageError("--state and --no-state: give one")
        return []
    from mcp_compiler.llm.spec import find_llm
    from mcp_compiler.state import StatePair, find_state_pairs

    if not p.state and not p.stateful and find_llm(model) is not None:
        return []   # a decoder LLM: its KV cache is the decoder runtime's (mcp_runtime.decoder), not the sequence batcher's
    pairs = find_state_pairs(model) if not p.state else [StatePair(*_given_pair(model, x), "given", "--state") for x in p.state]
    if not p.state:
        from mcp_compiler.state import proposed_pairs

        for x in proposed_pairs(model, pairs):
            warnings.append(f"input {x.input!r} and output {x.output!r} look like a state pair ({x.why}) and are not "
                            f"kept on the server: {' '.join(f'--state {q.input}={q.output}' for q in [*pairs, x])} "
                            "serves them so")
    if not pairs:
        if p.stateful:
            raise UsageError("stateful: the model has no state pairs (an input of its state and the output of the "
                             "next; `mcp-cli inspect` lists what it finds)")
        return []
    if backend != "python":
        warnings.append(f"state pairs found ({', '.join(f'{x.input}->{x.output}' for x in pairs)}) but the "
                        f"{backend} backend cannot keep them: served stateless (the python backend can)")
        return []
    values = {v.name: v for v in model.graph.inputs}
    outs = {v.name: v for v in model.graph.outputs}
    kept, left = [], []
    for pair in pairs:
        t, o = values[pair.input].type, outs[pair.output].type
        grows = pair.grows_axis if pair.kind == "kv" else None
        fixed = [k for k in range(len(t.shape or ())) if k != grows] if isinstance(t, TensorType) else []
        static = isinstance(t, TensorType) and t.shape is not None and all(isinstance(t.shape[k], int) for k in fixed)
        # served only where the next state is known to fit the state input: equal shapes but the axis a
        # KV cache grows along (silero's sequence model runs its LSTM over frames: h [1, 1, 128] in,
        # per-frame states [1, frames, 128] out)
        proven = (isinstance(o, TensorType) and o.shape is not None and t.shape is not None
                  and len(o.shape) == len(t.shape) and all(o.shape[k] == t.shape[k] for k in fixed))
        if not static or not proven:
            why = "a dim with no fixed size" if not static else "the next state's shape is not known to fit"
            left.append(f"{pair.input} ({why})")
            continue
        entry = {"input": pair.input, "output": pair.output, "dtype": np.dtype(DataType(t.elem_type).numpy_dtype).name,
                 "shape": [0 if k == grows else d for k, d in enumerate(t.shape)]}
        if grows is not None:   # a KV cache: empty at START, one step longer each request, bounded
            entry.update(grows_axis=grows, max_length=p.max_state_length)
        kept.append(entry)
    if left:
        msg = f"state kept with the client, not on the server: {', '.join(left)}"
        if p.stateful:
            raise UsageError(f"stateful: {msg}")
        warnings.append(msg)
        return []
    return kept


def _given_pair(model: Model, text: object) -> tuple[str, str]:
    """`IN=OUT` of --state: an input and an output of the model with the same type and shape."""
    if not isinstance(text, str) or text.count("=") != 1:
        raise UsageError(f"--state: expected INPUT=OUTPUT, got {text!r}")
    a, b = (x.strip() for x in text.split("="))
    ins = {v.name: v for v in model.graph.inputs if v.const is None}
    outs = {v.name: v for v in model.graph.outputs}
    if a not in ins:
        raise UsageError(f"--state {text}: the model has no input {a!r} (its inputs: {', '.join(ins)})")
    if b not in outs:
        raise UsageError(f"--state {text}: the model has no output {b!r} (its outputs: {', '.join(outs)})")
    if ins[a].type != outs[b].type:
        raise UsageError(f"--state {text}: {a} is {ins[a].type}, {b} is {outs[b].type}: a state must keep its type and shape")
    return a, b


def _sequence_batching(sb, p: ServingParams) -> None:  # noqa: ANN001 - ModelSequenceBatching
    """A stateful entry's sequence batcher (oldest, or direct): the runtime keeps each sequence's
    state, routed to it by correlation ID with START/END/READY."""
    sb.max_sequence_idle_microseconds = p.max_sequence_idle_us
    if p.sequence_strategy == "oldest":
        sb.oldest.max_candidate_sequences = p.max_sequences
    else:
        sb.direct.SetInParent()
    C = mc.ModelSequenceBatching.Control
    for ctl, kind in (("START", C.CONTROL_SEQUENCE_START), ("END", C.CONTROL_SEQUENCE_END),
                      ("READY", C.CONTROL_SEQUENCE_READY)):
        sb.control_input.add(name=ctl).control.add(kind=kind, int32_false_true=[0, 1])
    sb.control_input.add(name="CORRID").control.add(kind=C.CONTROL_SEQUENCE_CORRID, data_type=mc.TYPE_UINT64)


def _dequantizes_weights(model: Model) -> bool:
    """Whether a DequantizeLinear reads a constant (fp8 or int4-qdq weights) in a model whose
    arithmetic is float. A static int8 QDQ model (its activations quantized to int8/uint8 too)
    runs int8 kernels, which dequantizing at load would undo (benchmarks/bench_int8.py)."""
    if _int8_static(model):
        return False
    return any(n.op_type == "DequantizeLinear" and n.is_onnx() and n.inputs and n.inputs[0] is not None
               and n.inputs[0].const is not None for n in model.graph.nodes)


def _int8_static(model: Model) -> bool:
    """A QuantizeLinear of an activation (not a constant) to int8 or uint8."""
    from mcp_compiler.ir import DataType

    for n in model.graph.nodes:
        if n.op_type == "QuantizeLinear" and n.is_onnx() and n.inputs and n.inputs[0] is not None \
                and n.inputs[0].const is None and len(n.inputs) > 2 and n.inputs[2] is not None \
                and n.inputs[2].const is not None and n.inputs[2].const.dtype in (DataType.INT8, DataType.UINT8):
            return True
    return False


def _queue_policy(q, p: ServingParams) -> None:  # noqa: ANN001
    if p.max_concurrent_requests is not None:
        q.max_queue_size = p.max_concurrent_requests
    if p.inference_timeout_ms is not None:
        q.timeout_action = mc.ModelQueuePolicy.REJECT
        q.default_timeout_microseconds = p.inference_timeout_ms * 1000
        q.allow_timeout_override = True


WARMUP_LIMIT = 256 << 20   # bytes of one warm-up input: Triton allocates it at every load


def _warmup(cfg: mc.ModelConfig, model: Model, batched: bool, p: ServingParams) -> dict[str, bytes]:
    """One warm-up request per preferred batch size (batch 1 without), at sizes the model
    accepts (mcp_compiler.inputs; warmup_dims override them): floats random, integer inputs
    zeros where 0 is a valid value, else a data file with a value the model accepts (a sample
    rate compared with 16000). Returns the data files, relative to the model's folder."""
    from mcp_compiler.inputs import make, plan

    ip = plan(model, dict(p.warmup_dims), fold=False, flag="warmup_dims")
    files: dict[str, bytes] = {}
    inputs, _ = interface(model)
    batches = (sorted(set(p.preferred_batch_size)) or [1]) if batched else [0]
    for b in batches:
        w = cfg.model_warmup.add(name=f"mcp_warmup_batch_{b}", batch_size=b)
        sample = make(model, ip, np.random.default_rng(0), batch=b or None, limit=WARMUP_LIMIT,
                      flag="warmup_dims")
        for v in inputs:
            t = v.type
            data = sample[v.name]
            # (make() refused a sample over WARMUP_LIMIT already: one request is no larger)
            dims = list(data.shape[1:] if batched else data.shape) or [1]   # a scalar travels as [1]
            inp = w.inputs[v.name]
            inp.data_type = TRITON_DTYPES[t.elem_type]
            inp.dims.extend(dims)
            if data.dtype.kind == "f":
                inp.random_data = True
            elif data.dtype == bool or ip.zero_ok(v.name):
                inp.zero_data = True
            else:   # values from a set without 0: one request's worth, from the plan
                one = data[:1] if batched else data
                name = f"{v.name}_{b}.bin".replace("/", "_")
                files[f"warmup/{name}"] = np.ascontiguousarray(one).tobytes()
                inp.input_data_file = name
    return files


def to_pbtxt(cfg: mc.ModelConfig) -> str:
    return text_format.MessageToString(cfg)
