"""Test helpers: where the real models are, and small functions to build and run models."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "golden_models"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
# Set by .ci/run: a real model that cannot be fetched fails the run instead of skipping tests.
REQUIRE_FETCH = os.environ.get("MCP_CLI_REQUIRE_FETCH") == "1"

# Input sizes rapidocr uses (det needs multiples of 32).
ZOO_INPUTS = {
    "ch_PP-OCRv4_det_infer.onnx": (1, 3, 64, 96),
    "ch_PP-OCRv4_rec_infer.onnx": (1, 3, 48, 320),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": (1, 3, 48, 192),
}


@functools.cache
def fetched_zoo() -> tuple[tuple[Path, ...], str]:
    """The PP-OCR models of golden_models/zoo.yaml, fetched from their pinned PyPI wheel into the
    user's cache (~/.cache/mcp-cli, once), the way `mcp-cli zoo` gets them: (paths, why not)."""
    from mcp_compiler.errors import McpError
    from mcp_compiler.manifest import load_manifest
    from mcp_compiler.zoo import default_cache, fetch

    sources = [m.source for m in load_manifest(GOLDEN / "zoo.yaml").models
               if m.source.member and Path(m.source.member).name in ZOO_INPUTS]
    assert len(sources) == len(ZOO_INPUTS), "golden_models/zoo.yaml lost a PP-OCR model"
    try:
        paths = tuple(sorted((fetch(s, default_cache()) for s in sources), key=lambda p: p.name))
    except McpError as e:
        if REQUIRE_FETCH:
            raise RuntimeError(f"MCP_CLI_REQUIRE_FETCH=1 and the zoo models cannot be fetched: {e}") from None
        return (), f"zoo models not fetched (package index unreachable?): {e}"
    return paths, ""


def negated_mlp(path: Path) -> Path:
    """The golden MLP with its first weight negated: the same interface, other outputs (tells two
    deploys of one name apart)."""
    m = onnx.load(GOLDEN / "mlp" / "model.onnx")
    w = onnx.numpy_helper.to_array(m.graph.initializer[0]) * -1
    m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w, m.graph.initializer[0].name))
    onnx.save(m, path)
    return path


def raising_copy(entry: Path, dest: Path, method: str, message: str) -> Path:
    """A copy of a repository entry whose model.py raises `message` in `method` (initialize: a
    load failure on the server; execute: a failed inference); it passes every local check."""
    import shutil

    shutil.copytree(entry, dest)
    py = dest / "1" / "model.py"
    head = {"initialize": "    def initialize(self, args):\n", "execute": "    def execute(self, requests):\n"}[method]
    py.write_text(py.read_text().replace(head, f"{head}        raise RuntimeError({message!r})\n"))
    return dest


def zoo_model(name: str) -> Path:
    """One real model of golden_models/zoo.yaml by its manifest name, fetched from its pinned wheel
    into the user's cache; inside a test, skips with the reason when it cannot be fetched (fails
    with MCP_CLI_REQUIRE_FETCH=1)."""
    from mcp_compiler.errors import McpError
    from mcp_compiler.manifest import load_manifest
    from mcp_compiler.zoo import default_cache, fetch

    m = next(m for m in load_manifest(GOLDEN / "zoo.yaml").models if m.name == name)
    try:
        return fetch(m.source, default_cache())
    except McpError as e:
        if REQUIRE_FETCH:
            raise
        pytest.skip(f"{name} not fetched (package index unreachable?): {e}")


def zoo_models() -> list[Path]:
    """The three PP-OCR models (det, rec, cls by name order); inside a test, skips with the reason
    when they cannot be fetched."""
    paths, why = fetched_zoo()
    if why:
        pytest.skip(why)
    return list(paths)


def zoo_params(contains: str = "") -> list:
    """zoo_models() (those whose name contains `contains`) for @pytest.mark.parametrize: one
    skipped case, with the reason, when the models cannot be fetched (never an empty, silently
    skipped parameter set)."""
    paths, why = fetched_zoo()
    if why:
        return [pytest.param(Path("unfetched.onnx"), marks=pytest.mark.skip(reason=why))]
    return [p for p in paths if contains in p.name]


def light_models() -> list[Path]:
    return sorted(LIGHT.glob("*.onnx"))


def golden_dirs() -> list[Path]:
    return sorted(p for p in GOLDEN.iterdir() if (p / "model.onnx").exists())


def ort_run(model: onnx.ModelProto | str | Path, feeds: dict) -> list[np.ndarray]:
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def random_feeds(model: onnx.ModelProto, dims: dict[str, int] | None = None, seed: int = 0) -> dict:
    """Inputs for every graph input, symbolic dims taken from `dims` (default 2)."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 2)
                 for d in tt.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dt, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
        else:
            feeds[vi.name] = rng.integers(0, 3, shape).astype(dt)
    return feeds


def mlp_onnx(path: Path, d: int = 128, f: int = 256, layers: int = 2, opset: int = 17, seed: int = 0) -> Path:
    """A MatMul-heavy model to quantize: per layer Gemm(x, W1^T, b, transB=1, alpha) -> Relu ->
    MatMul(., W2); then Softmax. x: [batch, d]."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w1 = (rng.standard_normal((f, d)) * 0.05).astype(np.float32)   # stored transposed
        w2 = (rng.standard_normal((f, d)) * 0.05).astype(np.float32)
        b = (rng.standard_normal(f) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w1, f"w1_{i}"), numpy_helper.from_array(w2, f"w2_{i}"),
                  numpy_helper.from_array(b, f"b_{i}")]
        nodes += [helper.make_node("Gemm", [x, f"w1_{i}", f"b_{i}"], [f"h{i}"], name=f"fc1_{i}",
                                   transB=1, alpha=0.5, beta=2.0),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu_{i}"),
                  helper.make_node("MatMul", [f"r{i}", f"w2_{i}"], [f"y{i}"], name=f"fc2_{i}")]
        x = f"y{i}"
    nodes.append(helper.make_node("Softmax", [x], ["y"], axis=-1, name="softmax"))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", d])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def save_model(folder: Path, name: str, nodes, inputs, outputs, inits=(), opset: int = 17) -> Path:
    """folder/<name>.onnx: a graph of `nodes` at the given ai.onnx opset (IR version 8)."""
    from onnx import helper

    m = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    p = folder / f"{name}.onnx"
    onnx.save(m, p)
    return p


class Serve:
    """`mcp-cli serve ARGS` in the background, as a user's `serve repo &` (ports picked free): the
    banner's addresses as matches (`grpc`, `http`, `metrics`: group(1) is the URL)."""

    def __init__(self, args: list[str], env: dict | None = None) -> None:
        import queue
        import re
        import signal
        import subprocess
        import sys
        import tempfile
        import threading
        import time

        self._signal = signal
        self._err = tempfile.TemporaryFile("w+")   # a file, not a pipe: stderr never fills and blocks it
        self.p = subprocess.Popen([sys.executable, "-m", "mcp_compiler.cli", "serve", *args, "--http-port", "0",
                                   "--grpc-port", "0", "--metrics-port", "0"],
                                  stdout=subprocess.PIPE, stderr=self._err, text=True, env=env,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.out = ""
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.p.stdout.readline()), daemon=True).start()
        deadline = time.monotonic() + 180
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break   # a server that prints nothing is not waited on forever
            if not line:
                break
            self.out += line
            if "Ctrl-C stops it" in line:
                break
            threading.Thread(target=lambda: lines.put(self.p.stdout.readline()), daemon=True).start()
        self.grpc = re.search(r"gRPC +(grpc://\S+)", self.out)
        self.http = re.search(r"HTTP +(http://\S+)", self.out)
        self.metrics = re.search(r"metrics +(http://\S+)", self.out)

    def stop(self) -> tuple[int, str, str]:
        import subprocess

        if self.p.poll() is None:
            self.p.send_signal(self._signal.SIGINT)
        try:
            rest, _ = self.p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rest, _ = self.p.communicate(timeout=30)
        self._err.seek(0)
        err = self._err.read()
        self._err.close()
        return self.p.returncode, self.out + rest, err


class PostSink:
    """An HTTP server on 127.0.0.1 that takes POSTs (a stand-in OTLP collector): each body and its
    Content-Type go to `take(body, content_type)`, after `delay` seconds it answers `status`."""

    def __init__(self, take, status: int = 200, delay: float = 0.0) -> None:
        import http.server
        import threading
        import time

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay)
                take(body, self.headers.get("Content-Type") or "")
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def one_error(r, code: int, *expect: str) -> None:
    """A CLI run (subprocess.CompletedProcess) that failed as users should see it: exit `code`, one
    `error:` line on stderr holding each of `expect`, no internal error, no traceback."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code, r.stdout + r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "internal error" not in lines[0] and "Traceback" not in r.stderr
    for e in expect:
        assert e in lines[0], lines[0]


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed): a server that is not there."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
