"""Open a .mcpir by mmap, lower it to ONNX protobuf bytes, run it with onnxruntime (or OpenVINO).

Weights are not copied: each top-level initializer is described to onnxruntime as external data
that lives in the .mcpir file itself (location = the file, offset = its record's place in the
data section), so onnxruntime maps it like any external-data file; the protobuf only names it.
With prepacking off (`prepack=False`) onnxruntime computes straight from the mapping and a
session over a gigabyte of weights starts in milliseconds. The protobuf is encoded here by hand
(wire format), so the server needs no `onnx`.

With `engine="openvino"` the same lowered ONNX (weights embedded: OpenVINO reads it from memory,
where external data has no folder) is compiled by OpenVINO's CPU plugin at `precision` f32 or
bf16 (INFERENCE_PRECISION_HINT; bf16 runs on AMX / AVX512_BF16), latency hint, one stream,
`intra_op_threads` threads; with `cache_dir` (cache_dir_for: the folder the server uses), the
model as rewritten for OpenVINO and the compiled model are kept there (CACHE_DIR) so a later load
does not lower or compile again; both are named by the .mcpir's content and checked against
their digests before use.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import mcp_ir_generated as fb
from .verify import VerifyError, parse_layout, verify_buffer

if TYPE_CHECKING:
    import onnxruntime as ort

SCHEMA_MAJOR = 1
IDENTIFIER = b"MCPI"
_LAYOUT = parse_layout((Path(__file__).with_name("mcp_ir.fbs")).read_text(encoding="utf-8"))
_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64,
         14: 64, 15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8, 25: 2,
         26: 2, 27: 6, 28: 6}
# Smaller tensors are embedded in the protobuf (an external record costs more than its bytes).
_EXTERNAL_MIN_BYTES = 1024


class MCPIRError(ValueError):
    """The file is not a readable MCP-IR model."""


_DECLARED = b"mcp.declared_shapes"   # (compiler's lower.DECLARED_SHAPES) the original declared its inner shapes


class RunTimeout(RuntimeError):
    """A bounded run (MCPIRModel.run_within) did not end in time."""


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


ENGINES = ("onnxruntime", "openvino")
PRECISIONS = {"onnxruntime": ("f32",), "openvino": ("f32", "bf16")}
# What an entry's config names (parameters mcp_execution, mcp_precision) -> MCPIRModel's arguments.
EXECUTIONS = {("onnxruntime", "f32"): {},
              ("openvino", "f32"): {"engine": "openvino", "precision": "f32"},
              ("openvino", "bf16"): {"engine": "openvino", "precision": "bf16"},
              ("onnxruntime-cuda", "f32"): {"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]},
              ("onnxruntime-tensorrt", "f32"): {"providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                                              "CPUExecutionProvider"]},
              ("onnxruntime-tensorrt", "f16"): {"providers": [("TensorrtExecutionProvider", {"trt_fp16_enable": "True"}),
                                                              "CUDAExecutionProvider", "CPUExecutionProvider"]}}


def execution(runtime: str, precision: str) -> dict:
    """MCPIRModel's keyword arguments for an execution (a copy); an unknown one is an MCPIRError."""
    try:
        return {k: list(v) if isinstance(v, list) else v for k, v in EXECUTIONS[(runtime, precision)].items()}
    except KeyError:
        raise MCPIRError(f"unknown execution {runtime}/{precision} (known: "
                         f"{', '.join(f'{r}/{p}' for r, p in EXECUTIONS)})") from None


def import_openvino_lean() -> None:
    """Import OpenVINO's runtime without its model converter and without its telemetry, once per
    process. openvino's __init__ imports openvino.tools.ovc (and with it openvino_telemetry,
    urllib, email), 60 of its 100 ms here, none of it used to read and compile a model; and
    openvino_telemetry, on import, writes an analytics client id and stats under ~/intel and forks
    a child that resolves its analytics host. A compiler and a server must not phone out:
    openvino_telemetry is made unimportable in this process for good (OpenVINO's own code falls
    back to its telemetry stub then), and ovc left out of the import (a later
    `import openvino.tools.ovc` still works; only the `openvino.convert_model` shortcut is absent)."""
    import sys

    sys.modules.setdefault("openvino_telemetry", None)   # an ImportError: openvino uses its stub
    if "openvino" in sys.modules:
        return
    sys.modules["openvino.tools.ovc"] = None   # an ImportError, which openvino's __init__ catches
    try:
        import openvino  # noqa: F401
    finally:
        if "openvino.tools.ovc" in sys.modules and sys.modules["openvino.tools.ovc"] is None:
            del sys.modules["openvino.tools.ovc"]


class MCPIRModel:
    """A .mcpir file as an onnxruntime session (or an OpenVINO compiled model)."""

    def __init__(self, path: str | os.PathLike, *, providers: list | None = None,
                 intra_op_threads: int | None = None, options: ort.SessionOptions | None = None,
                 prepack: bool = True, keep_proto: bool = False, dequantize_at_load: bool = False,
                 engine: str = "onnxruntime", precision: str = "f32", cache_dir: str | None = None) -> None:
        if engine not in ENGINES or precision not in PRECISIONS[engine]:
            raise MCPIRError(f"engine {engine!r} at precision {precision!r} is not one this runtime runs "
                             "(onnxruntime: f32; openvino: f32, bf16)")
        self.engine, self.precision = engine, precision
        self.path = Path(path)
        t_start = time.time_ns()
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 12:
                raise MCPIRError(f"{self.path}: not an MCP-IR file")
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        mm = self._mm
        if mm[8:12] != IDENTIFIER:
            raise MCPIRError(f"{self.path}: not an MCP-IR file (identifier {mm[8:12]!r})")
        (n,) = struct.unpack_from("<I", mm, 0)
        if 4 + n > size:
            raise MCPIRError(f"{self.path}: corrupt MCP-IR: header runs past the end")
        header = mm[4:4 + n]
        try:
            verify_buffer(header, _LAYOUT)
        except VerifyError as e:
            raise MCPIRError(f"{self.path}: corrupt MCP-IR: {e}") from None
        root = fb.Model.GetRootAs(header, 0)
        major = root.SchemaVersion().Major()
        if major != SCHEMA_MAJOR:
            raise MCPIRError(f"{self.path}: MCP-IR schema major version {major} is not supported "
                             f"by this runtime ({SCHEMA_MAJOR})")
        align = root.DataAlignment()
        if align < 1 or align & (align - 1):
            raise MCPIRError(f"{self.path}: corrupt MCP-IR: bad data alignment {align}")
        self._data_start = (4 + n + align - 1) // align * align
        self._data_length = root.DataLength()
        if self._data_start + self._data_length > size:
            raise MCPIRError(f"{self.path}: corrupt MCP-IR: data section runs past the end (truncated?)")
        self._location = os.path.basename(self.path).encode("utf-8")
        self._embed = engine == "openvino"
        saved = None
        if engine == "openvino" and cache_dir and not keep_proto:
            import hashlib

            saved = _ov_saved(cache_dir, hashlib.sha256(mm).hexdigest())   # the file as it is now, read once
        if saved is not None and _ov_saved_intact(saved):
            # this file lowered, read and rewritten for OpenVINO by an earlier load: read as it was
            # saved (a saved model that does not read is a cache miss: the file is lowered again)
            t_read = time.time_ns()
            try:
                self._compile_openvino(None, intra_op_threads, cache_dir, saved=saved)
                self.load_phases = [("mcp.read_model", t_start, t_read), ("mcp.create_session", t_read, time.time_ns())]
                self.onnx_bytes = None
                return
            except MCPIRError:
                pass
        try:
            proto = _Lowering(self).model(root)
        except (AttributeError, TypeError, IndexError, struct.error, UnicodeDecodeError) as e:
            raise MCPIRError(f"{self.path}: corrupt MCP-IR: {type(e).__name__}: {e}") from None
        t_read = time.time_ns()
        if engine == "openvino":
            self._compile_openvino(proto, intra_op_threads, cache_dir, save=saved)
            self.load_phases = [("mcp.read_model", t_start, t_read), ("mcp.create_session", t_read, time.time_ns())]
            self.onnx_bytes = proto if keep_proto else None
            return
        import onnxruntime as ort  # here, not at the top: an OpenVINO entry never loads it (~50 ms of its cold start)

        so = options or ort.SessionOptions()
        if intra_op_threads:
            so.intra_op_num_threads = intra_op_threads
        # External data is resolved against this folder (the session is built from bytes).
        so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                    str(self.path.resolve().parent))
        if not prepack:
            so.add_session_config_entry("session.disable_prepacking", "1")
        if dequantize_at_load:
            # constant folding then folds DequantizeLinear of the weights too (it leaves them for
            # QDQ kernel fusion otherwise): float32 weights in memory, computed once
            so.add_session_config_entry("session.disable_quant_qdq", "1")
        try:
            self.session = ort.InferenceSession(proto, so, providers=providers or ["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime's Fail/InvalidGraph/...: the file's model is bad
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise MCPIRError(f"{self.path}: the model in this MCP-IR file does not load in onnxruntime: {first}") from None
        # Wall-clock ns of the load's phases (spans and the load metrics of the served model):
        # reading (map, verify, lower to ONNX) and building the session (prepacking and
        # dequantize-at-load folding happen there).
        self.load_phases = [("mcp.read_model", t_start, t_read), ("mcp.create_session", t_read, time.time_ns())]
        # The lowered ONNX (weights named, not included), for inspection and tests.
        self.onnx_bytes = proto if keep_proto else None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def _compile_openvino(self, proto: bytes | None, threads: int | None, cache_dir: str | None,
                          saved: str | None = None, save: str | None = None) -> None:
        try:
            import_openvino_lean()
            import openvino as ov
        except ImportError:
            raise MCPIRError(f"{self.path}: the entry runs on OpenVINO, which is not installed in this Python "
                             "(pip install openvino)") from None
        self._ov_core = core = ov.Core()
        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1",
                  "INFERENCE_PRECISION_HINT": self.precision}
        if threads:
            config["INFERENCE_NUM_THREADS"] = str(threads)
        if cache_dir:
            # one folder of compiled models per precision: OpenVINO 2026.4 finds a model compiled
            # at f32 when asked for bf16 in the same CACHE_DIR (from a model read from a file), and
            # the bf16 request then crashes the process (a stub that loaded READY dies on its first
            # request; measured: tune reloading an f32 trial as bf16)
            config["CACHE_DIR"] = os.path.join(str(cache_dir), self.precision)
        self._ov_blobs = _Blobs(config["CACHE_DIR"]) if cache_dir else None
        self._ov_config = config
        compiled = staged = None
        try:
            if saved is not None:
                # saved (published) only after it compiled here: the load's check was passed then
                self._ov_model, self.ov_rewrites = core.read_model(saved), None
            else:
                model = core.read_model(proto)
                self.ov_rewrites = _ov_jit_ops(model)
                staged = _ov_stage(ov, model, save) if save is not None else None
                if staged is not None:
                    # compiled from the model as saved: a later load, reading it, finds this compile in CACHE_DIR
                    model = core.read_model(staged)
                compiled = self._ov_compile(model)   # any shape: the load's check
                if staged is not None:
                    _ov_publish(staged, save)
                self._ov_model = model
            if compiled is None:   # the saved model: its compile comes from the cache
                compiled = self._ov_compile(self._ov_model)
        except Exception as e:  # noqa: BLE001 - OpenVINO's conversion and compile errors
            if staged is not None and compiled is None:   # never published: nothing of it stays
                _unlink(staged, staged[:-4] + ".bin")
            raise MCPIRError(f"{self.path}: the model does not compile in OpenVINO: {_first(e)}") from None
        self.session = None
        # The model compiled for any shape, in the load (from the cache when warm), is the one
        # `verify` and the profile check: it runs every request unless serve() was asked for and a
        # static model of the request's shape passed its check (_Static).
        self._ov_compiled = compiled
        self._ov_request = compiled.create_infer_request()
        self._dynamic_inputs = [i.get_any_name() for i in self._ov_model.inputs if i.get_partial_shape().is_dynamic]
        self._static: dict = {}
        self.input_names = [i.get_any_name() for i in self._ov_model.inputs]
        self.output_names = [o.get_any_name() for o in self._ov_model.outputs]

    def _ov_compile(self, model):  # noqa: ANN001, ANN202 - an openvino.Model; its CompiledModel
        if self._ov_blobs is None:
            return self._ov_core.compile_model(model, "CPU", self._ov_config)
        return self._ov_blobs.compile(self._ov_core, model, self._ov_config)

    _compiler: _Static | None = None
    _ov_stuck = ""   # why this OpenVINO model runs nothing more (a bounded run it could not stop)

    def serve(self) -> None:
        """Serving: shapes that come back get a model compiled for them, in a background thread
        (_Static). Static kernels ran 2-17% faster than the any-shape model's in-process on five
        zoo models here, and PP-OCRv4's detector served 1.12x onnxruntime with them against 0.93x
        without. Nothing to do for onnxruntime, or a model whose shapes are all fixed."""
        if self.session is None and self._dynamic_inputs and self._compiler is None:
            self._compiler = _Static(self)

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> list[np.ndarray]:
        if self.session is not None:
            return self.session.run(outputs, feeds)
        if self._ov_stuck:
            raise RunTimeout(self._ov_stuck)
        req = self._ov_request
        if self._compiler is not None:
            key = tuple((n, feeds[n].shape) for n in self._dynamic_inputs if n in feeds)
            req = self._static.get(key, req)
            if req is self._ov_request:
                self._compiler.seen(key, feeds)
        return _outputs(req, req.infer(feeds), outputs or self.output_names)

    def run_within(self, feeds: dict[str, np.ndarray], seconds: float) -> list[np.ndarray]:
        """`run`, ended after `seconds` (a RunTimeout): onnxruntime's run is told to terminate,
        OpenVINO's request is cancelled, so nothing keeps computing after it (a Loop that runs for
        ever). For a profile: each candidate's run is bounded, not only the measurement."""
        if self.session is not None:
            import threading

            import onnxruntime as ort

            opts = ort.RunOptions()
            timer = threading.Timer(seconds, lambda: setattr(opts, "terminate", True))
            timer.daemon = True
            timer.start()
            try:
                return self.session.run(None, feeds, opts)
            except Exception:
                if opts.terminate:
                    raise RunTimeout(f"a run took longer than {seconds:g} s") from None
                raise
            finally:
                timer.cancel()
        if self._ov_stuck:
            raise RunTimeout(self._ov_stuck)
        req = self._ov_request
        req.start_async(feeds)
        if not req.wait_for(max(1, int(seconds * 1000))):
            # OpenVINO's cancel stops a request between its nodes only: one inside a Loop keeps
            # computing (and a new request waits for it), so this model runs nothing more
            req.cancel()
            self._ov_stuck = f"a run took longer than {seconds:g} s (OpenVINO could not stop it)"
            raise RunTimeout(self._ov_stuck)
        return _outputs(req, req.results, self.output_names)

    # -- weights ------------------------------------------------------------------------------
    def tensor_bytes(self, t: fb.Tensor) -> tuple[int, int]:
        """(absolute offset, length) of a tensor's bytes, checked against the data section."""
        off, length = t.Offset(), t.Length()
        numel = 1
        for j in range(t.DimsLength()):
            d = t.Dims(j)
            if d < 0:
                raise MCPIRError(f"{self.path}: corrupt MCP-IR: negative dimension")
            numel *= d
        bits = _BITS.get(t.Dtype())
        if bits is None or length != (numel * bits + 7) // 8 or off + length > self._data_length:
            raise MCPIRError(f"{self.path}: corrupt MCP-IR: bad weight record {t.Name()!r}")
        return self._data_start + off, length

    def external(self, t: fb.Tensor, length: int) -> bool:
        """Whether a top-level initializer is left in the file as external data (never for
        OpenVINO, which reads the lowered model from memory)."""
        return not self._embed and length >= _EXTERNAL_MIN_BYTES and bool(t.Name())


def _outputs(req, got, names: list[str]) -> list[np.ndarray]:  # noqa: ANN001 - an InferRequest, its results
    ports = {n: o for o in req.model_outputs for n in o.get_names()}
    # copies: the request's output buffers are reused by the next call
    return [np.array(got[ports[n]]) for n in names]


def _agree(a: list[np.ndarray], b: list[np.ndarray], precision: str) -> bool:
    """Whether two programs' outputs for one input are the same computation: float outputs
    within a cosine of 1e-5 (f32) or 5e-4 (bf16) of each other, the others equal."""
    tol = 1e-5 if precision == "f32" else 5e-4
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False
        if not np.issubdtype(x.dtype, np.floating):
            if not np.array_equal(x, y):
                return False
            continue
        x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            if not np.array_equal(x, y, equal_nan=True):
                return False
            continue
        nx, ny = np.linalg.norm(x), np.linalg.norm(y)
        if nx == 0 or ny == 0:
            if np.abs(x - y).max(initial=0.0) > tol:
                return False
        elif 1 - float(x @ y) / (nx * ny) > tol:
            return False
    return True


class _Static:
    """A serving MCPIRModel's static models, compiled in a daemon thread (OpenVINO's compile
    releases the GIL: the any-shape model answers meanwhile) for each shape on its second
    request, at most SHAPES of them. A static model runs that shape only after it gave the
    any-shape model's outputs on that request's inputs (_agree): OpenVINO 2026.4 computes some
    models wrong compiled for a static shape and right for any shape (the zoo's T5 encoder:
    cosine 0.71 to onnxruntime static, 0.99999 any-shape; PP-OCRv4's recognizer: 0.996 and
    1.00000). One that does not is dropped, and that shape stays on the any-shape model. A
    compile here never stalls a request (on first sight, a 97 MB ViT's new batch size took
    0.5-1.1 s), though requests run slower while it takes the cores (OpenVINO's CPU plugin has
    no COMPILATION_NUM_THREADS)."""

    SHAPES = 8
    COUNTED = 1024   # shapes counted at once: a long-running server is not a growing table

    def __init__(self, model: MCPIRModel) -> None:
        import queue
        import threading

        self.model = model
        self.count: dict = {}
        self.refused: list = []   # shapes whose static model did not agree
        self._room = self.SHAPES
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._work, name="mcp-openvino-compile", daemon=True).start()

    def seen(self, key: tuple, feeds: dict[str, np.ndarray]) -> None:
        if self._room <= 0:
            return
        if len(self.count) >= self.COUNTED:   # shapes that never come back (any image size): forgotten
            self.count.clear()
        n = self.count[key] = self.count.get(key, 0) + 1
        if n == 2:
            self._room -= 1
            self._queue.put((key, {k: np.array(v) for k, v in feeds.items()}))

    def _work(self) -> None:
        m = self.model
        reference = m._ov_compiled.create_infer_request()   # the any-shape model, this thread's own request
        names = m.output_names
        while True:
            key, feeds = self._queue.get()
            try:
                shaped = m._ov_model.clone()
                shaped.reshape({n: list(shape) for n, shape in key})
                req = m._ov_compile(shaped).create_infer_request()
                ok = _agree(_outputs(req, req.infer(feeds), names), _outputs(reference, reference.infer(feeds), names),
                            m.precision)
            except Exception:  # noqa: BLE001 - a shape the model cannot be made static at: the any-shape one runs it
                ok = False
            if ok:
                m._static[key] = req
            else:
                self.refused.append(key)


# The form of a saved OpenVINO model (what _ov_jit_ops and the lowering make): a new one is not
# read by a runtime that made another.
OV_SAVED_FORM = 2


def cache_dir_for(path: str | os.PathLike) -> str | None:
    """Where OpenVINO's work on the .mcpir at `path` is kept (the saved model, CACHE_DIR):
    `ov_cache` beside it when that is a folder of ours we can write (not a link), else this
    user's private folder in the system temp folder (made 0700; used only while it is a real
    folder owned by us that nobody else can write); None, no cache, where neither is. What is
    kept there is named by the content it was made from and checked before use (_ov_saved,
    _Blobs), so whoever can write the folder can make a load slower, not change what it runs."""
    import tempfile

    here = os.path.join(os.path.dirname(os.path.abspath(path)), "ov_cache")
    if _own_folder(here, private=False):
        return here
    mine = os.path.join(tempfile.gettempdir(), f"mcp-ov-cache-{os.getuid()}")
    return mine if _own_folder(mine, private=True) else None


def _own_folder(path: str, *, private: bool) -> bool:
    """Whether `path` is (made if absent) a real folder owned by this user that we can write,
    and, `private`, that no one else can read or write (mode 0700 at most)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or not os.access(path, os.W_OK):
        return False
    return not (private and st.st_mode & 0o077)


def _file_sha256(path: str) -> str | None:
    import hashlib

    try:
        with open(path, "rb", buffering=0) as f:
            h = hashlib.sha256()
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return h.hexdigest()
    except OSError:
        return None


def _ov_saved(cache_dir: str, content: str) -> str | None:
    """Where the OpenVINO model of a .mcpir whose bytes hash to `content` is saved in
    `cache_dir` (OpenVINO IR, xml + bin, and their digests in a .sha256 beside them): named by
    that content, this runtime's form and OpenVINO's version, never by the file's path or date.
    Reading it took 0.03 s where lowering and reading the ONNX took 0.5 s (a 97 MB ViT); the
    compiled model itself is in CACHE_DIR, found by OpenVINO from the model read."""
    import hashlib

    try:
        import_openvino_lean()
        import openvino as ov
    except ImportError:   # the compile says so, with the remedy
        return None
    key = f"{content}:{OV_SAVED_FORM}:{ov.get_version()}"
    return os.path.join(cache_dir, f"model-{hashlib.sha256(key.encode()).hexdigest()[:32]}.xml")


def _ov_saved_intact(xml: str) -> bool:
    """Whether the saved model `xml` (and its .bin) is byte for byte what this runtime saved:
    the digests written with it when it was published. One that is not (changed, truncated,
    planted without digests) is removed: a cache miss, lowered and saved again."""
    base = xml[:-4]
    if not os.path.isfile(xml) or os.path.islink(xml):
        _remove_any(xml, base + ".bin", base + ".sha256")   # (a folder or link in its place: a miss, not a failure)
        return False
    try:
        with open(base + ".sha256", encoding="ascii") as f:
            want = f.read(200).split()
    except (OSError, UnicodeDecodeError):
        want = []
    if len(want) == 2 and [_file_sha256(xml), _file_sha256(base + ".bin")] == want:
        return True
    _unlink(xml, base + ".bin", base + ".sha256")
    return False


class _Blobs:
    """OpenVINO's compiled models in a CACHE_DIR folder, each with the sha256 of its bytes in a
    `.sha256` beside it, written by this runtime after the compile that made it. OpenVINO reads
    a blob it finds without a check of its own; before each compile with the folder, a blob
    whose digest is missing or differs is removed (OpenVINO compiles again and writes it anew)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def _names(self) -> set[str]:
        try:
            return {n for n in os.listdir(self.folder) if not n.endswith(".sha256")}
        except OSError:
            return set()

    def check(self) -> set[str]:
        """The folder's blobs as they are now, a changed or unsigned one removed first."""
        kept = set()
        for name in self._names():
            path = os.path.join(self.folder, name)
            try:
                with open(path + ".sha256", encoding="ascii") as f:
                    want = f.read(100).strip()
            except (OSError, UnicodeDecodeError):
                want = None
            if want is not None and not os.path.islink(path) and _file_sha256(path) == want:
                kept.add(name)
            else:
                _remove_any(path, path + ".sha256")
        return kept

    def sign(self, before: set[str]) -> None:
        """The digests of the blobs written since `before` (the compile just made them)."""
        for name in self._names() - before:
            path = os.path.join(self.folder, name)
            digest = _file_sha256(path)
            if digest is not None:
                _write_atomic(path + ".sha256", digest.encode())

    def compile(self, core, model, config: dict):  # noqa: ANN001, ANN202 - openvino's Core, Model, CompiledModel
        before = self.check()
        compiled = core.compile_model(model, "CPU", config)
        self.sign(before)
        return compiled


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        _unlink(tmp)


def _ov_stage(ov, model, xml: str) -> str | None:  # noqa: ANN001 - the openvino module, an openvino.Model
    """`model` saved beside `xml` under a name of this process (xml + bin), to be published as
    `xml` once it compiled; None where it could not be written (a cache: the next load only
    takes longer)."""
    tmp = f"{xml[:-4]}.tmp{os.getpid()}.xml"
    try:
        ov.save_model(model, tmp, compress_to_fp16=False)
        return tmp
    except (OSError, RuntimeError):
        _unlink(tmp, tmp[:-4] + ".bin")
        return None


def _ov_publish(tmp: str, xml: str) -> None:
    """The staged model as `xml`, whole or not at all: its .bin and digests are in place before
    the .xml a later load looks for."""
    digests = f"{_file_sha256(tmp)} {_file_sha256(tmp[:-4] + '.bin')}\n"
    try:
        os.replace(tmp[:-4] + ".bin", xml[:-4] + ".bin")
        _write_atomic(xml[:-4] + ".sha256", digests.encode())
        os.replace(tmp, xml)
    except OSError:
        _unlink(tmp, tmp[:-4] + ".bin")


def _remove_any(*paths: str) -> None:
    """Remove what is at each path, a folder or a link included (never what a link points to)."""
    import shutil

    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            _unlink(p)


def _unlink(*paths: str) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def _ov_jit_ops(model) -> int:  # noqa: ANN001 - an openvino.Model, changed in place
    """Replace ONNX HardSigmoid, which OpenVINO's CPU plugin runs in a reference kernel (and
    reorders the tensor's layout around it, twice per use), by ops its JIT runs: HSigmoid where
    alpha = 1/6 and beta = 0.5 (then x * HSigmoid(x) fuses into HSwish at compile), else
    Clamp(alpha * x + beta, 0, 1). The passes make this form from x * Clip(x + 3, 0, 6) / 6 (opset
    < 14 has no HardSwish). Measured here: ppocr_cls 3.8 -> 1.7 ms f32, 3.6 -> 1.5 ms bf16. Returns
    how many were replaced."""
    import openvino.opset13 as ops

    n = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "HardSigmoid":
            continue
        consts = [op.input_value(k).get_node() for k in (1, 2)]
        if any(c.get_type_name() != "Constant" for c in consts):
            continue
        alpha, beta = (float(np.asarray(c.get_data()).reshape(-1)[0]) for c in consts)
        x = op.input_value(0)
        if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
            new = ops.hsigmoid(x)
        else:
            dt = x.get_element_type().to_dtype()
            new = ops.clamp(ops.add(ops.multiply(x, ops.constant(np.array(alpha, dtype=dt))),
                                    ops.constant(np.array(beta, dtype=dt))), 0.0, 1.0)
        new.set_friendly_name(op.get_friendly_name())
        op.output(0).replace(new.output(0))
        n += 1
    if n:
        model.validate_nodes_and_infer_types()
    return n


# -- protobuf wire format ------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 fields: two's complement, as protobuf does
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _int(field: int, v: int) -> bytes:
    return _varint(field << 3) + _varint(v)


def _len(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _str(field: int, v: bytes | None) -> bytes:
    return _len(field, v) if v else b""


def _packed_ints(field: int, vs) -> bytes:  # noqa: ANN001
    return _len(field, b"".join(_varint(int(v)) for v in vs)) if len(vs) else b""


class _Lowering:
    """MCP-IR FlatBuffer tables -> ONNX protobuf messages (field numbers from onnx.proto)."""

    def __init__(self, owner: MCPIRModel) -> None:
        self.o = owner
        self.symbols: list[bytes] = []
        self.depth = 0
        self.declared = False

    def model(self, r: fb.Model) -> bytes:
        self.symbols = [r.Symbols(j).Name() for j in range(r.SymbolsLength())]
        # the main graph's inner shapes as the original declared them (compiler's lower.to_onnx)
        self.declared = any(r.MetadataProps(j).Key() == _DECLARED for j in range(r.MetadataPropsLength()))
        # fields in their numbers' order, as protobuf writes them (OpenVINO's ONNX reader refused
        # some models whose opset_import, field 8, came before the graph)
        parts = [_int(1, r.IrVersion())]
        parts += [_str(2, r.ProducerName()), _str(3, r.ProducerVersion()), _str(4, r.Domain()),
                  _int(5, r.ModelVersion()) if r.ModelVersion() else b"", _str(6, r.DocString()),
                  _len(7, self.graph(r.Graph(), top=True))]
        parts += [_len(8, self.opset(r.OpsetImports(j))) for j in range(r.OpsetImportsLength())]
        parts += self.props(14, r, skip=_DECLARED)
        parts += [_len(25, self.function(r.Functions(j))) for j in range(r.FunctionsLength())]
        return b"".join(parts)

    @staticmethod
    def opset(o: fb.OperatorSetId) -> bytes:
        return _str(1, o.Domain()) + _int(2, o.Version())

    @staticmethod
    def props(field: int, obj, skip: bytes | None = None) -> list[bytes]:  # noqa: ANN001
        out = []
        for j in range(obj.MetadataPropsLength()):
            kv = obj.MetadataProps(j)
            if skip is not None and kv.Key() == skip:
                continue
            out.append(_len(field, _str(1, kv.Key()) + _str(2, kv.Value())))
        return out

    def function(self, f: fb.Function) -> bytes:
        p = [_str(1, f.Name())]
        p += [_len(4, f.Inputs(j)) for j in range(f.InputsLength())]
        p += [_len(5, f.Outputs(j)) for j in range(f.OutputsLength())]
        p += [_len(6, f.Attributes(j)) for j in range(f.AttributesLength())]
        p += [_len(11, self.attribute(f.AttributeProtos(j))) for j in range(f.AttributeProtosLength())]
        p += [_len(7, self.node(f.Nodes(j))) for j in range(f.NodesLength())]
        p += [_str(8, f.DocString())]
        p += [_len(9, self.opset(f.OpsetImports(j))) for j in range(f.OpsetImportsLength())]
        p += [_str(10, f.Domain()), _str(13, f.Overload())]
        p += [_len(12, self.value(f.ValueInfo(j))) for j in range(f.ValueInfoLength())]
        p += self.props(14, f)
        return b"".join(p)

    def graph(self, g: fb.Graph, top: bool = False) -> bytes:
        self.depth += 1
        if self.depth > 64:
            raise MCPIRError("corrupt MCP-IR: subgraphs nested too deeply")
        p = [_len(1, self.node(g.Nodes(j))) for j in range(g.NodesLength())]
        p += [_str(2, g.Name())]
        p += [_len(5, self.tensor(g.Initializers(j), top)) for j in range(g.InitializersLength())]
        p += [_len(15, self.sparse(g.SparseInitializers(j))) for j in range(g.SparseInitializersLength())]
        p += [_str(10, g.DocString())]
        p += [_len(11, self.value(g.Inputs(j))) for j in range(g.InputsLength())]
        p += [_len(12, self.value(g.Outputs(j))) for j in range(g.OutputsLength())]
        if not top or self.declared:   # the main graph's: only where the original declared them
            p += [_len(13, self.value(g.ValueInfo(j))) for j in range(g.ValueInfoLength())]
        p += self.props(16, g)
        self.depth -= 1
        return b"".join(p)

    def node(self, n: fb.Node) -> bytes:
        p = [_len(1, n.Inputs(j)) for j in range(n.InputsLength())]
        p += [_len(2, n.Outputs(j)) for j in range(n.OutputsLength())]
        p += [_str(3, n.Name()), _len(4, n.OpType()), _str(7, n.Domain()), _str(8, n.Overload())]
        p += [_len(5, self.attribute(n.Attributes(j))) for j in range(n.AttributesLength())]
        p += [_str(6, n.DocString())]
        p += self.props(9, n)
        return b"".join(p)

    def value(self, v: fb.Value) -> bytes:
        t = v.Type()
        p = [_len(1, v.Name()), _len(2, self.type(t)) if t is not None else b"", _str(3, v.DocString())]
        p += self.props(4, v)
        return b"".join(p)

    def type(self, t: fb.Type, depth: int = 0) -> bytes:
        if depth > 64:
            raise MCPIRError("corrupt MCP-IR: types nested too deeply")
        kind = t.Kind()
        inner = t.ValueType()
        body = b""
        if kind in (fb.TypeKind.TENSOR, fb.TypeKind.SPARSE_TENSOR):
            body = _int(1, t.ElemType())
            if t.HasShape():
                body += _len(2, b"".join(_len(1, self.dim(t.Dims(j))) for j in range(t.DimsLength())))
            field = 1 if kind == fb.TypeKind.TENSOR else 8
        elif kind == fb.TypeKind.SEQUENCE:
            body = _len(1, self.type(inner, depth + 1)) if inner is not None else b""
            field = 4
        elif kind == fb.TypeKind.MAP:
            body = _int(1, t.KeyType()) + (_len(2, self.type(inner, depth + 1)) if inner is not None else b"")
            field = 5
        elif kind == fb.TypeKind.OPTIONAL:
            body = _len(1, self.type(inner, depth + 1)) if inner is not None else b""
            field = 9
        else:
            field = 0
        out = _len(field, body) if field else b""
        return out + _str(6, t.Denotation())

    def dim(self, d: fb.Dim) -> bytes:
        kind = d.Kind()
        if kind == fb.DimKind.CONSTANT:
            body = _int(1, d.Value())
        elif kind == fb.DimKind.SYMBOL:
            body = _len(2, self.symbol(d.Symbol()))
        elif kind == fb.DimKind.EXPR:
            body = _len(2, self.expr(d.Expr(), 0).encode())
        else:
            body = b""
        return body + _str(3, d.Denotation())

    def symbol(self, i: int) -> bytes:
        if i >= len(self.symbols):
            raise MCPIRError("corrupt MCP-IR: symbol index out of range")
        return self.symbols[i]

    _OPS = {fb.ExprOp.ADD: "+", fb.ExprOp.SUB: "-", fb.ExprOp.MUL: "*", fb.ExprOp.FLOOR_DIV: "//",
            fb.ExprOp.CEIL_DIV: "/^", fb.ExprOp.MOD: "%", fb.ExprOp.MAX: "max", fb.ExprOp.MIN: "min"}

    def expr(self, e: fb.ShapeExpr, depth: int) -> str:
        """The same text the compiler's lowering writes as dim_param (mcp_compiler.ir.dims)."""
        if e is None or depth > 64:
            raise MCPIRError("corrupt MCP-IR: bad shape expression")
        op = e.Op()
        if op == fb.ExprOp.CONST:
            return str(e.Value())
        if op == fb.ExprOp.SYMBOL:
            return self.symbol(e.Symbol()).decode("utf-8")
        sym = self._OPS.get(op)
        if sym is None:
            raise MCPIRError("corrupt MCP-IR: bad shape expression")
        a, b = self.expr(e.Lhs(), depth + 1), self.expr(e.Rhs(), depth + 1)
        return f"{sym}({a}, {b})" if sym.isalpha() else f"({a} {sym} {b})"

    def tensor(self, t: fb.Tensor, top: bool = False) -> bytes:
        p = [_packed_ints(1, [t.Dims(j) for j in range(t.DimsLength())]), _int(2, t.Dtype()),
             _str(8, t.Name()), _str(12, t.DocString())]
        if t.Dtype() == 8:  # STRING
            p += [_len(6, self.bytes_(t.StringData(j))) for j in range(t.StringDataLength())]
        else:
            absolute, length = self.o.tensor_bytes(t)
            if top and self.o.external(t, length):
                for key, value in ((b"location", self.o._location),
                                   (b"offset", str(absolute).encode()), (b"length", str(length).encode())):
                    p.append(_len(13, _str(1, key) + _str(2, value)))
                p.append(_int(14, 1))  # data_location = EXTERNAL
            else:
                p.append(_len(9, self.o._mm[absolute:absolute + length]))
        p += self.props(16, t)
        return b"".join(p)

    @staticmethod
    def bytes_(b: fb.Bytes) -> bytes:
        return b.DataAsNumpy().tobytes() if b.DataLength() else b""

    def sparse(self, s: fb.SparseTensor) -> bytes:
        dims = s.DimsAsNumpy().tolist() if s.DimsLength() else []
        return _len(1, self.tensor(s.Values())) + _len(2, self.tensor(s.Indices())) + _packed_ints(3, dims)

    def attribute(self, a: fb.Attribute) -> bytes:
        k = a.Type()
        p = [_len(1, a.Name()), _int(20, k), _str(13, a.DocString())]
        if a.RefAttrName():
            p.append(_len(21, a.RefAttrName()))
            return b"".join(p)
        if k == 1:
            p.append(_varint(2 << 3 | 5) + struct.pack("<f", a.F()))
        elif k == 2:
            p.append(_int(3, a.I()))
        elif k == 3:
            p.append(_len(4, a.SAsNumpy().tobytes() if a.SLength() else b""))
        elif k == 4:
            p.append(_len(5, self.tensor(a.T())))
        elif k == 5:
            p.append(_len(6, self.graph(a.G())))
        elif k == 6:
            p.append(_len(7, a.FloatsAsNumpy().astype("<f4").tobytes()) if a.FloatsLength() else b"")
        elif k == 7:
            p.append(_packed_ints(8, a.IntsAsNumpy().tolist() if a.IntsLength() else []))
        elif k == 8:
            p += [_len(9, self.bytes_(a.Strings(j))) for j in range(a.StringsLength())]
        elif k == 9:
            p += [_len(10, self.tensor(a.Tensors(j))) for j in range(a.TensorsLength())]
        elif k == 10:
            p += [_len(11, self.graph(a.Graphs(j))) for j in range(a.GraphsLength())]
        elif k == 11:
            p.append(_len(22, self.sparse(a.SparseTensor())))
        elif k == 12:
            p += [_len(23, self.sparse(a.SparseTensors(j))) for j in range(a.SparseTensorsLength())]
        elif k == 13:
            p.append(_len(14, self.type(a.Tp())))
        elif k == 14:
            p += [_len(15, self.type(a.TypeProtos(j))) for j in range(a.TypeProtosLength())]
        return b"".join(p)
