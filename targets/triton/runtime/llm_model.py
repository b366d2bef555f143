"""Triton python-backend entry point of a decoder LLM's generation entry (decoupled: a response a token).

Copied to <model>/<version>/model.py by mcp-cli. `execute` hands each request to the engine
(mcp_runtime.engine: the KV-cache block pool, prefix reuse, continuous batching) and returns at
once; the engine's thread sends each token as a response, then a final one with the finish
reason and the usage counts (TRITONSERVER_RESPONSE_COMPLETE_FINAL).

Inputs (all optional, one of the first three): `text_input` (UTF-8), `messages` (a JSON list of
{"role", "content"}, through the model's chat template), `input_ids` (token ids);
`sampling_parameters` (JSON: max_tokens, temperature, top_p, top_k, seed, stop, stop_token_ids,
ignore_eos, prefix_cache). Outputs: `text_output` (this response's text), `token_ids` (its ids),
`finish_reason` ("" until the last: stop, length, error), `usage` (JSON, on the last).
A request that can never run, or one over the queue, gets one error response at once; a client
that goes away (cancelled) has its blocks freed within a step. Metrics: mcp_kv_cache_blocks_total,
mcp_kv_cache_blocks_used, mcp_prompt_tokens_total, mcp_prefix_cache_hit_tokens_total,
mcp_generated_tokens_total, mcp_time_to_first_token_seconds, mcp_time_between_tokens_seconds.
With `mcp-cli serve --trace`, each request's spans mcp.queue, mcp.prefill and mcp.decode go
under Triton's own (mcp_runtime.telemetry).
"""

import json
import os
import queue
import sys
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from mcp_runtime.lifetime import exit_with_parent  # noqa: E402

exit_with_parent()   # the stub ends with its tritonserver, however that ended

from mcp_runtime import MCPIRModel  # noqa: E402
from mcp_runtime.decoder import Decoder  # noqa: E402
from mcp_runtime.engine import Busy, Engine, Request, RequestError, Sampling, SlotPool, slot_tokens  # noqa: E402
from mcp_runtime.params import read as read_params  # noqa: E402
from mcp_runtime.telemetry import Telemetry, trace_context  # noqa: E402
from mcp_runtime.text import ChatTokenizer, StreamText, TokenizerInfo  # noqa: E402

MAX_PROMPT_BYTES = 4 << 20          # text or messages: larger is refused before tokenizing
MAX_STOPS, MAX_STOP_CHARS, MAX_STOP_IDS = 16, 256, 1024
SAMPLING_KEYS = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos",
                 "prefix_cache"}
BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


def _memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        p = read_params({k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()})
        g = p.generation
        if g is None:
            raise pb_utils.TritonModelException("not a generation entry (no mcp_generation parameter)")
        self.model = MCPIRModel(os.path.join(HERE, p.runtime), intra_op_threads=p.intra_op_threads or None,
                                prepack=p.prepack)
        self.decoder = Decoder(self.model)
        info = TokenizerInfo.from_metadata(self.model.session.get_modelmeta().custom_metadata_map)
        self.tok = ChatTokenizer(info) if info is not None else None
        d = self.decoder
        self.context = d.context or 2048
        per_token = SlotPool.bytes_per_token(d.layers, d.kv_heads, d.head_size)
        bs, slots = g["block_size"], g["max_running"]
        budget = g["kv_cache_bytes"] or int(_memory_bytes() * g["kv_cache_fraction"])
        tokens = slot_tokens(budget, slots, bs, per_token, self.context)
        if tokens < bs:
            raise pb_utils.TritonModelException(f"kv_cache_bytes {budget} holds no block of {bs} tokens for each of "
                                                f"{slots} sequences ({per_token} bytes a token)")
        # a pool sized by the user (--kv-cache-bytes) is held from the load on: READY means allocated
        self.pool = SlotPool(slots, tokens, bs, d.layers, d.kv_heads, d.head_size, commit=bool(g["kv_cache_bytes"]))
        eos = info.eos_ids if info is not None else []
        timeout = g["queue_timeout_ms"] / 1000 if g["queue_timeout_ms"] else None
        self.engine = Engine(self.model.session, self.pool, context=self.context, eos_ids=eos, vocab=d.vocab,
                             max_queue=g["max_queue"], prefill_chunk=g["prefill_chunk"], queue_timeout_s=timeout,
                             prefix_caching=g["prefix_caching"])
        # the responses go out from a thread of their own, in order: the engine's next step
        # runs while they are sent (onnxruntime lets go of the GIL)
        self.outbox = queue.SimpleQueue()
        threading.Thread(target=self._send_loop, name="mcp-llm-outbox", daemon=True).start()
        name = args.get("model_name", cfg.get("name", "?"))
        self.metrics = _Metrics(name, str(args.get("model_version", "?")), self.engine)
        # `mcp-cli serve --trace`: each request's queue, prefill and decode as spans under Triton's
        self.tel = Telemetry.create(name, str(args.get("model_version", "?")))

    # -- a request ------------------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._start(request, sender)
            except (RequestError, Busy, ValueError) as e:
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as e:  # noqa: BLE001 - this request fails, the server goes on
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    f"internal error: {type(e).__name__}: {e}")), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _input(self, request, name):
        t = pb_utils.get_input_tensor_by_name(request, name)
        return None if t is None else t.as_numpy()

    def _text(self, request, name):
        a = self._input(request, name)
        if a is None:
            return None
        raw = np.asarray(a, dtype=object).reshape(-1)
        if raw.size != 1:
            raise RequestError(f"{name} takes one string, got {raw.size}")
        v = raw[0]
        if isinstance(v, str):
            v = v.encode("utf-8", "surrogatepass")
        if len(v) > MAX_PROMPT_BYTES:
            raise RequestError(f"{name} is {len(v):,} bytes: more than the {MAX_PROMPT_BYTES:,} a request may bring")
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(f"{name} is not valid UTF-8 (byte {e.start})") from None

    def _prompt(self, request):
        text, messages, ids = (self._text(request, "text_input"), self._text(request, "messages"),
                               self._input(request, "input_ids"))
        given = [n for n, v in (("text_input", text), ("messages", messages), ("input_ids", ids)) if v is not None]
        if len(given) != 1:
            raise RequestError("give one of text_input, messages or input_ids" +
                               (f" (got {', '.join(given)})" if given else ""))
        if ids is not None:
            return [int(t) for t in np.asarray(ids).reshape(-1)]
        if self.tok is None:
            raise RequestError("this entry has no tokenizer: send input_ids")
        if messages is not None:
            try:
                msgs = json.loads(messages)
            except ValueError:
                raise RequestError("messages is not JSON") from None
            if not isinstance(msgs, list) or not msgs or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in msgs):
                raise RequestError('messages must be a non-empty list of {"role": str, "content": str}')
            text = self.tok.chat(msgs)
        if len(text) > self.context * 64:   # no tokenizer packs more than that into the context
            raise RequestError(f"the prompt ({len(text):,} characters) cannot fit the context of {self.context} tokens")
        return self.tok.encode(text)

    def _sampling(self, request):
        raw = self._text(request, "sampling_parameters")
        try:
            d = json.loads(raw) if raw else {}
        except ValueError:
            raise RequestError("sampling_parameters is not JSON") from None
        if not isinstance(d, dict):
            raise RequestError("sampling_parameters must be a JSON object")
        unknown = sorted(set(d) - SAMPLING_KEYS)
        if unknown:
            raise RequestError(f"unknown sampling parameter {unknown[0][:40]!r} (known: {', '.join(sorted(SAMPLING_KEYS))})")
        stops = d.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        if not isinstance(stops, list) or len(stops) > MAX_STOPS or \
                not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
            raise RequestError(f"stop must be at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} characters")
        stop_ids = d.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or len(stop_ids) > MAX_STOP_IDS or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids):
            raise RequestError(f"stop_token_ids must be a list of at most {MAX_STOP_IDS} token ids")
        for k in ("ignore_eos", "prefix_cache"):
            if k in d and not isinstance(d[k], bool):
                raise RequestError(f"{k} must be true or false")
        s = Sampling(max_tokens=d.get("max_tokens", 16), temperature=d.get("temperature", 0.0),
                     top_p=d.get("top_p", 1.0), top_k=d.get("top_k", 0), seed=d.get("seed"), stop_ids=stop_ids,
                     ignore_eos=d.get("ignore_eos", False), prefix_cache=d.get("prefix_cache", True))
        return s, stops

    def _start(self, request, sender):
        prompt = self._prompt(request)
        sampling, stops = self._sampling(request)
        text = StreamText(self.tok.decode, stops) if self.tok is not None else None
        traced = trace_context(request) if self.tel is not None else None
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

        def send(delta, ids, finish="", usage="", flags=0):
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([delta.encode("utf-8")], dtype=object)),
                pb_utils.Tensor("token_ids", np.asarray(ids, np.int64)),
                pb_utils.Tensor("finish_reason", np.array([finish.encode()], dtype=object)),
                pb_utils.Tensor("usage", np.array([usage.encode()], dtype=object))]), flags=flags)

        def handle(event):
            if "error" in event:
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(event["error"])),
                            flags=final)
                return
            delta = text.take(event) if text is not None else ""
            if "token" in event:
                send(delta, [event["token"]])
                return
            send(delta, [], event["finish"], json.dumps(event["usage"]), flags=final)
            self.metrics.finished(event["usage"])
            if self.tel is not None:
                arrived, admitted, first, done = event["times_ns"]
                admitted, first = admitted or done, first or done
                self.tel.request(traced, [("mcp.queue", arrived, admitted), ("mcp.prefill", admitted, first),
                                          ("mcp.decode", first, done)], 1)

        def emit(event):   # in the engine's thread
            if sender.is_cancelled():
                raise ConnectionError("the client cancelled")   # the engine drops it: its slot freed at the next step
            if stops:
                handle(event)   # a stop string must be seen before the engine runs the next step
            else:
                self.outbox.put(lambda: handle(event))

        stopped = (lambda token: text.stopped) if text is not None else None
        self.engine.submit(Request(prompt, sampling, emit, stopped, gone=sender.is_cancelled))

    def _send_loop(self):
        while True:
            job = self.outbox.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # noqa: BLE001 - a client gone: the engine hears it from is_cancelled
                pass

    def finalize(self):
        self.metrics.stop()
        self.engine.close()
        self.outbox.put(None)
        if self.tel is not None:
            self.tel.shutdown()


class _Metrics:
    """The engine's pool and token counts as Triton custom metrics, refreshed by a thread every
    250 ms and at each finished request; None where the python backend has no metrics API."""

    def __init__(self, model, version, engine):
        self.engine = engine
        labels = {"model": model, "version": version}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen = {"prompt_tokens": 0, "prefix_hit_tokens": 0, "generated_tokens": 0}
        try:
            F = pb_utils.MetricFamily
            fam = lambda n, k, d: F(name=n, kind=k, description="mcp-cli LLM: " + d)  # noqa: E731
            self.families = [
                fam("mcp_kv_cache_blocks_total", F.GAUGE, "blocks of the KV-cache pool"),
                fam("mcp_kv_cache_blocks_used", F.GAUGE, "blocks held by running requests (cached free blocks not counted)"),
                fam("mcp_prompt_tokens_total", F.COUNTER, "prompt tokens of admitted requests"),
                fam("mcp_prefix_cache_hit_tokens_total", F.COUNTER, "prompt tokens found in the prefix cache"),
                fam("mcp_generated_tokens_total", F.COUNTER, "tokens generated"),
                fam("mcp_time_to_first_token_seconds", F.HISTOGRAM, "arrival to first token"),
                fam("mcp_time_between_tokens_seconds", F.HISTOGRAM, "between a stream's tokens")]
            total, used, prompt, hits, gen, ttft, tbt = self.families
            self.total, self.used = total.Metric(labels=labels), used.Metric(labels=labels)
            self.counters = {"prompt_tokens": prompt.Metric(labels=labels), "prefix_hit_tokens": hits.Metric(labels=labels),
                             "generated_tokens": gen.Metric(labels=labels)}
            self.ttft, self.tbt = ttft.Metric(labels=labels, buckets=BUCKETS), tbt.Metric(labels=labels, buckets=BUCKETS)
        except (AttributeError, pb_utils.TritonModelException):
            self.families = None
            return
        self.total.set(engine.pool.blocks_total)
        self._thread = threading.Thread(target=self._refresh_loop, daemon=True, name="mcp-llm-metrics")
        self._thread.start()

    def _refresh(self):
        if self.families is None:
            return
        with self._lock:
            st = self.engine.stats
            self.used.set(self.engine.pool.used())
            for k, m in self.counters.items():
                now = getattr(st, k)
                if now > self._seen[k]:
                    m.increment(now - self._seen[k])
                    self._seen[k] = now
            for q, h in ((st.ttft, self.ttft), (st.tbt, self.tbt)):
                while q:
                    h.observe(q.popleft())

    def _refresh_loop(self):
        while not self._stop.wait(0.25):
            self._refresh()

    def finished(self, usage):
        self._refresh()

    def stop(self):
        self._stop.set()
