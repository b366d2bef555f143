"""Triton python-backend entry point for an mcp-cli model (copied to <model>/<version>/model.py).

Runs `model.mcpir` beside it through the bundled `mcp_runtime` package (numpy, flatbuffers and
onnxruntime only). With dynamic batching, the requests Triton hands over together are
concatenated along axis 0 and run as one batch when their other dims agree. With state pairs
(parameter `mcp_state`, Triton's sequence batcher), each sequence's state is kept here between
its requests (mcp_runtime.SequenceState): clients send only the non-state inputs.

Observability: the load's phases and the runtime's errors are Triton custom metrics on the
server's metrics port (mcp_model_load_seconds{phase=read|session|total}, mcp_runtime_errors_total,
mcp_trace_spans_dropped); with `mcp-cli serve --trace`, spans of the load and of each sampled
request go to the collector under the server's own spans (mcp_runtime.telemetry).
"""

import time

_T_IMPORT = time.time_ns()   # the imports below (numpy, the runtime) are a load phase

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from mcp_runtime.lifetime import exit_with_parent  # noqa: E402

exit_with_parent()   # the stub ends with its tritonserver, however that ended

from mcp_runtime import MCPIRModel, SequenceState, execution  # noqa: E402
from mcp_runtime.params import read as read_params  # noqa: E402
from mcp_runtime.telemetry import Telemetry, trace_context  # noqa: E402

_T_READY = time.time_ns()


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.max_batch = int(cfg.get("max_batch_size", 0))
        p = read_params({k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()})
        path = os.path.join(HERE, p.runtime)
        # the execution the entry was built for (mcp-cli convert --runtime): onnxruntime fp32 by default
        how = execution(p.execution, p.precision)
        if how.get("engine") == "openvino":
            from mcp_runtime.runtime import cache_dir_for, import_openvino_lean

            import_openvino_lean()   # its converter left out: 60 ms of a cold start
            how["cache_dir"] = cache_dir_for(path)
        self.model = MCPIRModel(path, intra_op_threads=p.intra_op_threads or None, prepack=p.prepack,
                                dequantize_at_load=p.dequantize_at_load, **how)
        self.model.serve()   # OpenVINO: shapes that come back get their own compile, in the background
        name, version = args.get("model_name", cfg.get("name", "?")), str(args.get("model_version", "?"))
        self.tel = Telemetry.create(name, version)
        self.metrics = _Metrics(name, version, traced=self.tel is not None)
        phases = [("mcp.import", _T_IMPORT, _T_READY), *self.model.load_phases]
        self.metrics.loaded(phases)
        if self.tel is not None:
            self.tel.load(_T_IMPORT, phases)
        self.inputs = [i["name"] for i in cfg["input"]]
        self.outputs = [o["name"] for o in cfg["output"]]
        # scalars the model takes or gives travel as [1] (Triton has no scalars without batching)
        self.scalars = set(p.scalars)
        self.sequences = None
        if p.state:
            idle = int(cfg.get("sequence_batching", {}).get("max_sequence_idle_microseconds", 0) or 0)
            self.sequences = SequenceState(p.state, p.max_sequences or 1024, idle / 1e6 if idle else 60.0)

    def _feeds(self, request):
        feeds = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs}
        return {n: a.reshape(()) if n in self.scalars else a for n, a in feeds.items()}

    def execute(self, requests):
        if self.sequences is not None:
            responses = [self._step(r) for r in requests]
        else:
            responses = self._execute(requests)
        self.metrics.after(responses, self.tel)
        return responses

    def _execute(self, requests):
        feeds, decoded = [], []   # each request's inputs and when its decoding began and ended
        for r in requests:
            d0 = time.time_ns()
            feeds.append(self._feeds(r))
            decoded.append((d0, time.time_ns()))
        t0, t1 = decoded[0][0], decoded[-1][1]
        if self.max_batch > 0 and len(feeds) > 1 and _stackable(feeds):
            sizes = [f[self.inputs[0]].shape[0] for f in feeds]
            joined = {n: np.concatenate([f[n] for f in feeds]) for n in self.inputs}
            try:
                outs = self.model.run(joined, self.outputs)
            except Exception as e:  # noqa: BLE001 - reported to each client
                return [_error(e) for _ in requests]
            t2 = time.time_ns()
            bounds = np.cumsum([0] + sizes)
            responses = [_response(self.outputs, [o[a:b] for o in outs]) for a, b in zip(bounds, bounds[1:])]
            self._traced(requests, t0, t1, t2, time.time_ns())
            return responses
        responses = []
        for r, f, (d0, d1) in zip(requests, feeds, decoded):
            try:
                t1 = time.time_ns()
                outs = self.model.run(f, self.outputs)
                t2 = time.time_ns()
                responses.append(_response(self.outputs, outs))
                self._traced([r], d0, d1, t2, time.time_ns(), run_start=t1)
            except Exception as e:  # noqa: BLE001
                responses.append(_error(e))
        return responses

    def _traced(self, requests, t0, t1, t2, t3, run_start=None):
        """Spans of requests decoded in [t0, t1], run until t2 (from run_start, default t1), encoded until t3."""
        if self.tel is None:
            return
        phases = [("mcp.decode_inputs", t0, t1), ("mcp.onnxruntime.run", run_start or t1, t2),
                  ("mcp.encode_outputs", t2, t3)]
        for r in requests:
            self.tel.request(trace_context(r), phases, len(requests))

    def _step(self, request):
        def flag(name):
            t = pb_utils.get_input_tensor_by_name(request, name)
            return t is not None and bool(np.asarray(t.as_numpy()).reshape(-1)[0])

        try:
            corrid = int(np.asarray(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()).reshape(-1)[0])
            outs = self.sequences.step(self.model.run, self._feeds(request), self.outputs, corrid,
                                       flag("START"), flag("END"))
        except Exception as e:  # noqa: BLE001 - reported to the client
            return _error(e)
        return _response(self.outputs, outs)

    def finalize(self):
        if self.tel is not None:
            self.tel.shutdown()
        self.model = None


class _Metrics:
    """The runtime's Triton custom metrics (none where the python backend has no metrics API);
    the dropped-spans gauge only when the model is traced (else it would say 0 of nothing)."""

    def __init__(self, model, version, traced):
        labels = {"model": model, "version": version}
        try:
            gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
            # the families must outlive their metrics: kept here
            self.families = [
                pb_utils.MetricFamily(name="mcp_model_load_seconds", kind=gauge,
                                      description="mcp-cli runtime: seconds the last load took, by phase"),
                pb_utils.MetricFamily(name="mcp_runtime_errors_total", kind=counter,
                                      description="mcp-cli runtime: requests that failed in the runtime")]
            if traced:
                self.families.append(pb_utils.MetricFamily(name="mcp_trace_spans_dropped", kind=gauge,
                                                           description="mcp-cli runtime: spans the collector "
                                                                       "did not take"))
            load, errors = self.families[:2]
            self.load = {p: load.Metric(labels={**labels, "phase": p}) for p in ("import", "read", "session", "total")}
            self.errors = errors.Metric(labels=labels)
            self.dropped = self.families[2].Metric(labels=labels) if traced else None
        except (AttributeError, pb_utils.TritonModelException):
            self.load = self.errors = self.dropped = None

    def loaded(self, phases):
        if self.load is not None:
            for (_, a, b), key in zip(phases, ("import", "read", "session")):
                self.load[key].set((b - a) / 1e9)
            self.load["total"].set((phases[-1][2] - phases[0][1]) / 1e9)

    def after(self, responses, tel):
        if self.errors is None:
            return
        failed = sum(1 for r in responses if r.has_error())
        if failed:
            self.errors.increment(failed)
        if self.dropped is not None:
            self.dropped.set(tel.exporter.dropped)


def _stackable(feeds):
    first = feeds[0]
    return all(f[n].shape[1:] == first[n].shape[1:] for f in feeds[1:] for n in first)


def _response(names, arrays):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, np.asarray(a).reshape(1) if np.ndim(a) == 0 else a)
                                                      for n, a in zip(names, arrays)])


def _error(e):
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"{type(e).__name__}: {e}"))
