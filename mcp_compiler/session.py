"""Run an IR model in onnxruntime, handing it the weights as views (no second copy on disk)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .ir.graph import Model
from .ir.tensor import Tensor
from .lower import to_onnx

# Tensors smaller than this are embedded in the lowered proto: cheaper than an OrtValue each.
_EXTERNAL_MIN_BYTES = 1024
_PLACEHOLDER = "__mcpir_data__"


def create_session(model: Model, options: ort.SessionOptions | None = None,
                   providers: list[str] | None = None) -> ort.InferenceSession:
    """An InferenceSession for `model`; top-level weights are passed as OrtValues over views."""
    so = options or ort.SessionOptions()
    names: list[str] = []
    values: list[ort.OrtValue] = []
    external = {id(v.const) for v in model.graph.initializers.values()
                if _can_pass(v.const) and v.const.nbytes >= _EXTERNAL_MIN_BYTES}

    def sink(t: Tensor):  # noqa: ANN202
        if id(t) not in external:
            return None
        arr = t.numpy()
        names.append(t.name)
        values.append(ort.OrtValue.ortvalue_from_numpy(arr))
        return (_PLACEHOLDER, 0, t.nbytes)

    proto = to_onnx(model, sink=sink)
    if names:
        so.add_external_initializers(names, values)
    sess = ort.InferenceSession(proto.SerializeToString(), so,
                                providers=providers or ["CPUExecutionProvider"])
    sess._mcp_keepalive = values  # noqa: SLF001 - the views must outlive the session
    return sess


def _can_pass(t: Tensor) -> bool:
    if t.string_data is not None or t.dtype.packed:
        return False
    try:
        return t.dtype.numpy_dtype.type.__module__ == "numpy"
    except TypeError:
        return False


def run(model: Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return create_session(model).run(None, feeds)
