"""Writes a Triton model repository entry: DIR/NAME/config.pbtxt and DIR/NAME/<version>/...

The whole entry is built in a temp folder beside DIR/NAME and moved into place with os.replace,
so a failed or killed convert never leaves a half-written model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from mcp_compiler.errors import OutputExistsError, UsageError
from mcp_compiler.ir import Model
from mcp_compiler.lower import to_onnx
from mcp_compiler.mcpir import write_mcpir

from ..base import EmitResult, TargetOptions
from .config import build_config, check_name, to_pbtxt
from .params import ServingParams

RUNTIME_PACKAGE = "mcp_runtime"
_RUNTIME_FILES = ("__init__.py", "runtime.py")
# Models whose weights exceed protobuf's 2 GiB limit keep them in an external-data file.
_PROTO_LIMIT = 2**31 - 1 - (64 << 20)


def write_runtime(dest: Path) -> list[Path]:
    """Copy the serving runtime package (runtime, verifier, FlatBuffers code, schema) into dest."""
    pkg = dest / RUNTIME_PACKAGE
    pkg.mkdir(parents=True)
    src = resources.files("mcp_compiler.targets.triton").joinpath("runtime")
    for name in _RUNTIME_FILES:
        (pkg / name).write_bytes(src.joinpath(name).read_bytes())
    schema = resources.files("mcp_compiler.ir_schema")
    for name in ("mcp_ir_generated.py", "mcp_ir.fbs"):
        (pkg / name).write_bytes(schema.joinpath(name).read_bytes())
    verify = resources.files("mcp_compiler.mcpir").joinpath("verify.py")
    (pkg / "verify.py").write_bytes(verify.read_bytes())
    return sorted(pkg.iterdir())


def emit_repository(model: Model, out_dir: Path, options: TargetOptions, params: ServingParams,
                    version: int = 1) -> EmitResult:
    name = check_name(options.name if options.name is not None else "model")
    if options.backend not in ("python", "onnxruntime"):
        raise UsageError(f"--backend must be python or onnxruntime, got {options.backend!r}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--output {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / name
    if final.resolve().parent != out_dir.resolve():
        raise UsageError(f"model name {name!r} escapes the repository {out_dir}")
    if final.exists() and not options.force:
        raise OutputExistsError(f"{final} exists; pass --force to replace it")
    cfg, warnings = build_config(model, name, options.backend, params)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700; a server running as another user must read it
        vdir = tmp / str(version)
        vdir.mkdir()
        if options.backend == "python":
            write_mcpir(model, vdir / "model.mcpir")
            model_py = resources.files("mcp_compiler.targets.triton").joinpath("runtime", "model.py")
            (vdir / "model.py").write_bytes(model_py.read_bytes())
            write_runtime(vdir)
        else:
            _write_onnx(model, vdir / "model.onnx")
        (tmp / "config.pbtxt").write_text(to_pbtxt(cfg), encoding="utf-8")
        files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
        _swap_in(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return EmitResult(final, files, cfg, warnings)


def _swap_in(tmp: Path, final: Path) -> None:
    """Replace `final` by `tmp`; an old entry is moved aside first and removed after."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_onnx(model: Model, path: Path) -> None:
    total = sum(t.nbytes for t in model.tensors())
    if total < _PROTO_LIMIT:
        path.write_bytes(to_onnx(model).SerializeToString())
        return
    data_name = path.stem + ".onnx.data"
    with open(path.with_name(data_name), "wb") as data:
        def sink(t):  # noqa: ANN001, ANN202
            if t.nbytes < 1024:
                return None
            offset = data.tell()
            pad = (-offset) % 64
            data.write(b"\0" * pad)
            raw = t.raw
            for i in range(0, len(raw), 16 << 20):
                data.write(raw[i:i + (16 << 20)])
            return (data_name, offset + pad, t.nbytes)

        proto = to_onnx(model, sink=sink)
    path.write_bytes(proto.SerializeToString())
