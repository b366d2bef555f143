"""Run an IR model in onnxruntime without copying its weights.

Tensors that are views of a file (a `.mcpir` read by mmap, or ONNX external data) are described
to onnxruntime as external data in that file, which onnxruntime maps itself; other large
top-level initializers are handed over as OrtValues (add_external_initializers).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from .errors import UnsupportedError
from .ir.graph import Model
from .ir.tensor import Tensor
from .lower import to_onnx

_EXTERNAL_MIN_BYTES = 1024
_PLACEHOLDER = "__mcp_data__"

# onnxruntime's own warnings (coloured W: lines, up to dozens per model) never reach the user:
# what fails is reported through our one error line.
ort.set_default_logger_severity(3)


def quiet_options(*, prepack: bool = True) -> ort.SessionOptions:
    """Session options that log nothing (and, with prepack=False, keep no packed weight copies:
    the checks need no speed, and a 2 GB model must not cost 4 GB)."""
    so = ort.SessionOptions()
    so.log_severity_level = 4   # its errors too: a failed run raises, and we report it in one line
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    return so


def load_check_options(*, optimize: bool = True) -> ort.SessionOptions:
    """Options for a session that is built to be checked and dropped, never run: quiet, no packed
    weight copies, and no thread pools (their start was a fifth of the session at 10k nodes, and
    a spinning pool thread took turns with the writer beside it). Not `optimize`: loading alone is
    checked, resolving the graph and its kernels (optimizing was a quarter of the session's time at
    50k nodes)."""
    so = quiet_options(prepack=False)
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def load_check_file(path: str | os.PathLike) -> None:
    """The written ONNX file loads in onnxruntime (load_check)."""
    load_check(lambda: ort.InferenceSession(str(path), load_check_options(), providers=["CPUExecutionProvider"]),
               "onnxruntime")


def load_check(open_session, what: str) -> None:  # noqa: ANN001 - () -> a session
    """`open_session()` (a session made with load_check_options() and dropped) must work:
    a model onnxruntime refuses never becomes an output. LoadCheckError names `what` and the
    first line of onnxruntime's reason."""
    from .errors import LoadCheckError, McpError

    try:
        open_session()
    except McpError:
        raise
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors are not importable alike
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LoadCheckError(f"the emitted model does not load in {what}: {first} (--no-load-check skips this check)") from None


def create_session(model: Model, options: ort.SessionOptions | None = None,
                   providers: list[str] | None = None, *, prepack: bool = True) -> ort.InferenceSession:
    return session_maker(model, options, providers, prepack=prepack)()


def session_maker(model: Model, options: ort.SessionOptions | None = None,
                  providers: list[str] | None = None, *, prepack: bool = True) -> Callable[[], ort.InferenceSession]:
    """create_session in two steps: the lowering now (Python), the session when called
    (onnxruntime, which releases the GIL: a thread may build it while Python works on)."""
    so = options or quiet_options()
    top = {id(v.const) for v in model.graph.initializers.values() if v.const.nbytes >= _EXTERNAL_MIN_BYTES}
    folders: set[str] = set()
    names: list[str] = []
    values: list[ort.OrtValue] = []

    def sink(t: Tensor):  # noqa: ANN202
        if id(t) not in top or t.string_data is not None:
            return None
        if t.source is not None:
            path, offset = t.source
            folders.add(os.path.dirname(os.path.abspath(path)))
            return (os.path.basename(path), offset, t.nbytes)
        if t.dtype.packed or not t.dtype.numpy_dtype.type.__module__ == "numpy":
            return None
        names.append(t.name)
        values.append(ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(t.numpy())))
        return (_PLACEHOLDER, 0, t.nbytes)

    proto = to_onnx(model, sink=sink)
    if len(folders) > 1:
        raise UnsupportedError("weights come from files in several folders; onnxruntime resolves "
                               "external data against one", hint="convert to .mcpir first")
    if folders:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path", folders.pop())
    if names:
        so.add_external_initializers(names, values)
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    data = proto.SerializeToString()

    def make() -> ort.InferenceSession:
        sess = ort.InferenceSession(data, so, providers=providers or ["CPUExecutionProvider"])
        sess._mcp_keepalive = values
        return sess
    return make


def run(model: Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return create_session(model).run(None, feeds)
