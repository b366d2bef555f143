"""End to end on a real Triton (tritonserver 2.51 from nvidia-pytriton) on 127.0.0.1.

Converts the golden and zoo models into one repository, serves it, infers over HTTP and gRPC at
two batch sizes, and compares with onnxruntime on the original models.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from _helpers import GOLDEN, ZOO_INPUTS, fetched_zoo, golden_dirs, mlp_onnx, ort_run

from mcp_compiler import CompileOptions, compile_model

try:
    import pytriton  # noqa: F401

    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

if not HAVE_TRITON and os.environ.get("CI"):
    raise RuntimeError("CI must run the Triton end-to-end tests: install '.[dev,serve]'")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not HAVE_TRITON, reason="nvidia-pytriton not installed "
                                "(pip install -e '.[serve]') - no tritonserver to test against")]

# The zoo models when they could be fetched (test_roundtrip's test_zoo_is_present skips with
# the reason when not; CI sets MCP_CLI_REQUIRE_FETCH=1, which fails instead).
ZOO_PATHS = fetched_zoo()[0]
ZOO_DIMS = {p.name: ZOO_INPUTS[p.name] for p in ZOO_PATHS}


def _models():
    for d in golden_dirs():
        yield d.name, d / "model.onnx", dict(np.load(d / "inputs.npz"))
    for p in ZOO_PATHS:
        x = np.random.default_rng(1).random(ZOO_DIMS[p.name], dtype=np.float32)
        yield p.stem.replace(".", "_"), p, {"x": x}


MODELS = list(_models())
# (name, --quantize, backend): quantized entries served next to the float ones. The bundled
# tritonserver has only the python backend (the onnxruntime-backend files are checked by
# tests/test_triton_target.py::test_quantized_repository with onnxruntime itself).
QUANTIZED = [("q_int4", "int4", "python"), ("q_fp8", "fp8", "python")]
# entries the python runtime runs on OpenVINO (when it is installed: the `openvino` extra)
OPENVINO = [("ov_f32", "f32"), ("ov_bf16", "bf16")]
try:
    import openvino  # noqa: F401

    HAVE_OPENVINO = True
except ImportError:
    HAVE_OPENVINO = False


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from mcp_compiler.passes.quantize import QuantizeOptions
    from mcp_compiler.targets.triton.serve import TritonServer

    repo = tmp_path_factory.mktemp("repo")
    for i, (name, src, _) in enumerate(MODELS):
        # every other model without onnxruntime prepacking: both runtime paths get served
        compile_model(src, repo, CompileOptions.for_target(
            "triton-v1.12", name, settings={"max_queue_delay_us": 2000, "prepack": i % 2 == 0}))
    mlp = mlp_onnx(tmp_path_factory.mktemp("src") / "mlp.onnx")
    for name, level, backend in QUANTIZED:
        compile_model(mlp, repo, CompileOptions.for_target("triton-v1.12", name, backend=backend,
                                                           quantize=QuantizeOptions(mode=level)))
    if HAVE_OPENVINO:
        for name, precision in OPENVINO:
            compile_model(GOLDEN / "convnet" / "model.onnx", repo, CompileOptions.for_target(
                "triton-v1.12", name, settings={"runtime": "openvino", "precision": precision}))
    s = TritonServer(repo)
    s.mlp = mlp
    s.start()
    yield s
    s.close()


def _batched(name: str, feeds: dict, batch: int) -> dict | None:
    """`feeds` with `batch` samples at axis 0 when that axis is dynamic in every input; for a
    model with a fixed axis 0, its own feeds once (batch 1) and None otherwise."""
    src = next(s for n, s, _ in MODELS if n == name)
    m = onnx.load(src, load_external_data=False)
    dynamic = all(not vi.type.tensor_type.shape.dim[0].HasField("dim_value") for vi in m.graph.input)
    if not dynamic:
        return feeds if batch == 1 else None
    # distinct samples, so that a mix-up between batch rows would show
    return {k: np.concatenate([v[:1] * (1 + 0.25 * i) for i in range(batch)]).astype(v.dtype)
            for k, v in feeds.items()}


def _infer(client_mod, url: str, name: str, feeds: dict, outputs: list[str]) -> list[np.ndarray]:
    from tritonclient.utils import np_to_triton_dtype

    c = client_mod.InferenceServerClient(url)
    try:
        inputs = []
        for k, v in feeds.items():
            i = client_mod.InferInput(k, list(v.shape), np_to_triton_dtype(v.dtype))
            i.set_data_from_numpy(v)
            inputs.append(i)
        r = c.infer(name, inputs, outputs=[client_mod.InferRequestedOutput(o) for o in outputs])
        return [r.as_numpy(o) for o in outputs]
    finally:
        c.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("name", [n for n, _, _ in MODELS])
def test_served_outputs_match_onnxruntime(server, name, protocol):
    import tritonclient.grpc as tg
    import tritonclient.http as th

    client_mod, url = (th, server.http_url) if protocol == "http" else (tg, server.grpc_url)
    src, feeds = next((s, f) for n, s, f in MODELS if n == name)
    outputs = [o.name for o in onnx.load(src, load_external_data=False).graph.output]
    tried = 0
    for batch in (1, 2):
        f = _batched(name, feeds, batch)
        if f is None:
            continue
        tried += 1
        want = ort_run(src, f)
        got = _infer(client_mod, url, name, f, outputs)
        for o, a, b in zip(outputs, want, got):
            assert b.shape == a.shape, o
            # the default pipeline folds batch norms and fuses activations: float32 rounding only
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=f"{name}:{o}")
    assert tried >= 1


@pytest.mark.parametrize("name,level,backend", QUANTIZED)
def test_served_quantized_models(server, name, level, backend):
    # Served outputs equal the quantized model run locally (so Triton ran the quantized graph),
    # and are close to onnxruntime on the float original.
    import tritonclient.grpc as tg

    from mcp_compiler.targets.triton.verify import load_runtime

    x = np.random.default_rng(5).standard_normal((2, 128)).astype(np.float32)
    got = _infer(tg, server.grpc_url, name, {"x": x}, ["y"])[0]
    vdir = server.repository / name / "1"
    if backend == "python":
        local = load_runtime(vdir).MCPIRModel(vdir / "model.mcpir").run({"x": x})[0]
    else:
        local = ort_run(vdir / "model.onnx", {"x": x})[0]
    np.testing.assert_allclose(got, local, rtol=1e-6, atol=1e-7)
    want = ort_run(server.mlp, {"x": x})[0]
    cos = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.99 and not np.allclose(got, want, rtol=0, atol=1e-9)   # quantized, yet close


@pytest.mark.skipif(not HAVE_OPENVINO, reason="openvino not installed (pip install -e '.[openvino]')")
@pytest.mark.parametrize("name,precision", OPENVINO)
def test_served_openvino_entry_equals_in_process_openvino(server, name, precision):
    """The server adds nothing: what Triton returns is what the runtime's OpenVINO execution
    gives in this process, at the entry's precision; and it is onnxruntime's result within that
    precision's budget."""
    import tritonclient.grpc as tg

    from mcp_compiler.targets.triton.verify import load_runtime

    vdir = server.repository / name / "1"
    cfg = (vdir.parent / "config.pbtxt").read_text()
    assert '"mcp_execution"' in cfg and f'string_value: "{precision}"' in cfg
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    got = _infer(tg, server.grpc_url, name, {"x": x}, ["logits"])[0]
    rt = load_runtime(vdir)
    local = rt.MCPIRModel(vdir / "model.mcpir", **rt.execution("openvino", precision)).run({"x": x})[0]
    np.testing.assert_allclose(got, local, rtol=1e-6, atol=1e-6)
    want = ort_run(GOLDEN / "convnet" / "model.onnx", {"x": x})[0]
    cos = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.999
    assert (vdir / "ov_cache").is_dir() and any((vdir / "ov_cache").iterdir())   # compiled once, kept


def test_concurrent_requests_are_batched_correctly(server):
    # 16 concurrent single-sample requests: Triton's dynamic batcher hands several to model.py
    # at once, which runs them as one batch and splits the outputs back.
    import tritonclient.http as th

    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(16)]

    def one(x):
        return _infer(th, server.http_url, "mlp", {"x": x}, ["y"])[0]

    with ThreadPoolExecutor(16) as ex:
        got = list(ex.map(one, xs))
    for x, y in zip(xs, got):
        np.testing.assert_allclose(y, ort_run(GOLDEN / "mlp" / "model.onnx", {"x": x})[0], rtol=1e-6, atol=1e-7)
    import urllib.request

    metrics = urllib.request.urlopen(f"http://{server.http_url}/v2/models/mlp/stats").read().decode()
    assert '"inference_count"' in metrics


def test_cli_serve_help():
    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    r = CliRunner().invoke(app, ["serve", "--help"])
    assert r.exit_code == 0 and "127.0.0.1" in r.output


def _serve(args: list[str], tmpdir, until: str | None, timeout: float = 180.0):
    """Run `mcp-cli serve ARGS` with TMPDIR=tmpdir; once a stdout line contains `until`, Ctrl-C it.
    Returns (exit code, stdout, stderr)."""
    import signal
    import subprocess
    import sys
    import time

    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1")
    # SIGINT as a terminal has it: a test worker may run with SIGINT ignored, which the child
    # would inherit (Python then never raises KeyboardInterrupt)
    p = subprocess.Popen([sys.executable, "-m", "mcp_compiler.cli", "serve", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out = []
    deadline = time.monotonic() + timeout
    try:
        while until is not None and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            out.append(line)
            if until in line:
                break
        if until is not None and p.poll() is None:
            p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, "".join(out) + rest, err


def test_cli_serve_ports_and_cleanup(tmp_path):
    import socket

    from mcp_compiler.targets.triton.serve import HOST, free_port

    repo = tmp_path / "repo"
    repo.mkdir()
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    # a port the user gave that is taken: an error naming it, not a server on other ports
    with socket.socket() as s:
        s.bind((HOST, 0))
        s.listen()
        taken = s.getsockname()[1]
        rc, out, err = _serve([str(repo), "--http-port", str(taken), "--grpc-port", "0"], tmpdir, until=None)
    assert rc == 2 and err == f"error: --http-port {taken}: the port is in use on {HOST}\n", err
    # 0: free ports; the gRPC address with its scheme; Ctrl-C stops it and its folder goes
    grpc = free_port()
    rc, out, err = _serve([str(repo), "--http-port", "0", "--grpc-port", str(grpc), "--metrics-port", "0"],
                          tmpdir, until="Ctrl-C stops it")
    assert rc == 0, err
    assert f"gRPC     grpc://{HOST}:{grpc}" in out and "HTTP     http://127.0.0.1:" in out
    assert list(tmpdir.iterdir()) == []  # no mcp-triton-* folder left behind
