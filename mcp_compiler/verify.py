"""verify: the original ONNX in onnxruntime vs the emitted model through its own serving runtime."""

from __future__ import annotations

import gc
import importlib.util
import itertools
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import InvalidModelError, UsageError, VerificationError
from .frontend import load_onnx
from .ir import DataType, TensorType

_counter = itertools.count()
INPUT_LIMIT = 4 << 30   # bytes of one generated input: a static dim of 2**40 is an error, not a MemoryError


@dataclass
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    cosine: float
    ok: bool


@dataclass
class VerifyReport:
    repository: str
    backend: str
    samples: int
    dims: dict[str, int]
    rtol: float
    atol: float
    outputs: list[OutputCheck] = field(default_factory=list)
    quantization_level: str = "none"
    reference: str = "onnxruntime"     # what ran the original
    layouts: dict[str, str] = field(default_factory=dict)   # interface values not in the original's layout

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    def raise_if_failed(self) -> None:
        bad = [o for o in self.outputs if not o.ok]
        if bad:
            o = max(bad, key=lambda x: x.max_abs)
            raise VerificationError(
                f"{self.repository}: output {o.name!r} differs from onnxruntime on the original: "
                f"max abs {o.max_abs:.3g}, cosine {o.cosine:.6f} (atol {self.atol}, rtol {self.rtol})"
                + (f"; the model is quantized ({self.quantization_level}): give --atol/--rtol that "
                   "suit it, or see the conversion's accuracy report"
                   if self.quantization_level not in ("", "none") else ""))


def load_runtime(version_dir: Path):  # noqa: ANN201 - the bundled mcp_runtime module
    """Import the mcp_runtime package a repository carries (not mcp-cli's own copy)."""
    pkg = version_dir / "mcp_runtime"
    if not (pkg / "__init__.py").exists():
        raise InvalidModelError(version_dir, "no mcp_runtime package in the version folder")
    name = f"_mcp_runtime_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _latest_version(model_dir: Path) -> Path:
    versions = sorted((int(p.name), p) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        raise InvalidModelError(model_dir, "no version folder (e.g. 1/) in the model repository entry")
    return versions[-1][1]


def _dim_names(v, axis: int, d) -> list[str]:  # noqa: ANN001
    """The names a user may size dim `d` of input `v` by: its symbol, and for an unnamed dim (?,
    -1, none) the fresh symbol `inspect` shows for it (<input>_d<axis>)."""
    from .passes.shapes.symbolic_shapes import unnamed

    names = [d] if isinstance(d, str) and d else []
    if unnamed(d):
        names.append("".join(c if c.isalnum() or c == "_" else "_" for c in f"{v.name}_d{axis}"))
    return names


def input_symbols(model) -> list[str]:  # noqa: ANN001 - an IR Model
    """The symbolic dims of the model's inputs, in order of appearance."""
    seen: dict[str, None] = {}
    for v in model.graph.inputs:
        t = v.type
        if v.const is None and isinstance(t, TensorType) and t.shape is not None:
            for axis, d in enumerate(t.shape):
                if not isinstance(d, int):
                    seen.update((n, None) for n in _dim_names(v, axis, d))
    return list(seen)


def check_dims(model, dims: dict[str, int], flag: str = "--dims") -> None:  # noqa: ANN001
    """A size for a symbol the model does not have is a typo that would check the wrong size."""
    known = input_symbols(model)
    unknown = [k for k in dims if k not in known]
    if unknown:
        raise UsageError(f"{flag}: the model has no symbol {unknown[0]!r}; its input symbols: "
                         f"{', '.join(known) or 'none (every input dim is static)'}")


def random_inputs(model, dims: dict[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:  # noqa: ANN001
    feeds = {}
    for v in model.graph.inputs:
        if v.const is not None:
            continue
        t = v.type
        if not isinstance(t, TensorType) or t.shape is None:
            raise UsageError(f"input {v.name!r} has no tensor shape; verify cannot make inputs for it")
        shape = []
        for axis, d in enumerate(t.shape):
            if isinstance(d, int):
                shape.append(d)
                continue
            given = [dims[n] for n in _dim_names(v, axis, d) if n in dims]
            shape.append(given[-1] if given else 2 if axis == 0 else 32)
        dt = DataType(t.elem_type)
        npdt = dt.numpy_dtype
        size = dt.nbytes(math.prod(shape))
        if size > INPUT_LIMIT:
            raise UsageError(f"input {v.name!r} at shape {shape} would be {size} bytes, over the "
                             f"{INPUT_LIMIT >> 30} GiB limit for generated inputs; give smaller sizes with --dims")
        if dt == DataType.BOOL:
            feeds[v.name] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(npdt, np.floating):
            feeds[v.name] = rng.standard_normal(shape).astype(npdt)
        elif np.issubdtype(npdt, np.integer):
            feeds[v.name] = rng.integers(0, 3, shape).astype(npdt)
        else:
            raise UsageError(f"input {v.name!r}: verify cannot make random {dt.name} data")
    return feeds


def verify(input: str | os.PathLike, repository: str | os.PathLike, *, samples: int = 1,
           dims: dict[str, int] | None = None, rtol: float = 1e-3, atol: float = 1e-4,
           seed: int = 0) -> VerifyReport:
    """Compare the repository entry's outputs with onnxruntime on `input`, on random inputs.

    `repository` is DIR/NAME. Symbols not in `dims` get 2 at axis 0 and 32 elsewhere.
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from .files import check_regular_input

    check_regular_input(input)
    model_dir = Path(repository)
    cfg_path = model_dir / "config.pbtxt"
    if not cfg_path.is_file():
        raise UsageError(f"--repository {model_dir}: no config.pbtxt (expected DIR/NAME)")
    cfg = text_format.Parse(cfg_path.read_text(), mc.ModelConfig())
    vdir = _latest_version(model_dir)
    backend = cfg.backend or "onnxruntime"
    dims = dict(dims or {})
    model = load_onnx(input, check=False, infer_shapes=False).model
    check_dims(model, dims)
    rng = np.random.default_rng(seed)
    report = VerifyReport(str(model_dir), backend, samples, dims, rtol, atol)
    if "quantization_level" in cfg.parameters:
        report.quantization_level = cfg.parameters["quantization_level"].string_value
    # the interface's layout contract: NHWC values are the NCHW original's, transposed
    layouts = json.loads(cfg.parameters["mcp_layouts"].string_value) if "mcp_layouts" in cfg.parameters else {}
    report.layouts = layouts
    feeds = [random_inputs(model, dims, rng) for _ in range(samples)]
    del model
    # One model in memory at a time (the original's outputs are kept, not its session), and no
    # prepacked weight copies: checking a 2 GB model costs about 2 GB, not 4 or 8.
    names, wants, report.reference = _run_original(input, feeds)
    gc.collect()
    run = _emitted_runner(backend, vdir)
    stats: dict[str, list] = {}
    for sample, want in zip(feeds, wants):
        got = run({k: np.ascontiguousarray(v.transpose(0, 2, 3, 1)) if layouts.get(k) == "NHWC" else v
                   for k, v in sample.items()})
        for name, a, b in zip(names, want, got):
            if layouts.get(name) == "NHWC":
                b = np.asarray(b).transpose(0, 3, 1, 2)
            stats.setdefault(name, []).append(_compare(a, b, rtol, atol))
    for name, rows in stats.items():
        report.outputs.append(OutputCheck(
            name, max(r[0] for r in rows), max(r[1] for r in rows), min(r[2] for r in rows),
            all(r[3] for r in rows)))
    return report


def _session_options():  # noqa: ANN202 - onnxruntime.SessionOptions
    from .session import quiet_options

    return quiet_options(prepack=False)


def _run_original(input: str | os.PathLike, feeds: list[dict]) -> tuple[list[str], list[list], str]:
    """The original's output names, its outputs on every sample, and what ran it: onnxruntime, or
    onnx.reference where onnxruntime has no kernel for one of its ops."""
    import onnxruntime as ort

    try:
        original = ort.InferenceSession(str(input), _session_options(), providers=["CPUExecutionProvider"])
        reference = "onnxruntime"
    except Exception as e:  # noqa: BLE001 - no kernel for an op the conversion legalized
        if "NOT_IMPLEMENTED" not in str(e):
            raise UsageError(f"onnxruntime cannot load the original {input}: {str(e).splitlines()[0]}") from None
        from onnx.reference import ReferenceEvaluator

        original = _Reference(ReferenceEvaluator(str(input)))
        reference = "onnx.reference (onnxruntime has no kernel for an op of the original)"
    wants = []
    for sample in feeds:
        try:
            wants.append(original.run(None, sample))
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"the original model fails on the random inputs "
                             f"({ {k: list(v.shape) for k, v in sample.items()} }): "
                             f"{str(e).splitlines()[0]}; give symbol sizes with --dims") from None
    return [o.name for o in original.get_outputs()], wants, reference


def _emitted_runner(backend: str, vdir: Path):  # noqa: ANN202 - feeds -> outputs
    if backend == "python":
        emitted = load_runtime(vdir).MCPIRModel(vdir / "model.mcpir", options=_session_options(), prepack=False)
        return emitted.run
    import onnxruntime as ort

    sess = ort.InferenceSession(str(vdir / "model.onnx"), _session_options(), providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


class _Reference:
    """onnx.reference.ReferenceEvaluator with onnxruntime's run/get_outputs surface."""

    def __init__(self, ev) -> None:  # noqa: ANN001
        self.ev = ev

    def run(self, names, feeds):  # noqa: ANN001, ANN201
        return self.ev.run(names, feeds)

    def get_outputs(self):  # noqa: ANN201
        from types import SimpleNamespace

        return [SimpleNamespace(name=n) for n in self.ev.output_names]


def _compare(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> tuple[float, float, float, bool]:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("inf"), float("inf"), 0.0, False
    if a.dtype.kind in "OSU" or a.dtype == bool:
        same = bool(np.array_equal(a, b))
        return (0.0 if same else 1.0), (0.0 if same else 1.0), (1.0 if same else 0.0), same
    fa, fb = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    diff = np.abs(fa - fb)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(fa), 1e-12)).max()) if diff.size else 0.0
    na, nb = np.linalg.norm(fa), np.linalg.norm(fb)
    cos = float(fa @ fb / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    ok = bool(np.allclose(fb, fa, rtol=rtol, atol=atol, equal_nan=True))
    return max_abs, max_rel, cos, ok
