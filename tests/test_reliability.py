"""Atomic outputs under SIGKILL, concurrent converts, determinism, names that reach Triton, and
random graphs through convert + verify."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from _helpers import GOLDEN
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2 as mc

from mcp_compiler import CompileOptions, compile_model
from mcp_compiler.mcpir import read_mcpir
from mcp_compiler.targets.triton.verify import verify

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
T = "triton-v1.12"


@pytest.fixture(scope="module")
def big_model(tmp_path_factory) -> Path:
    """~192 MB of FP32 weights as external data: long enough to be killed mid-write."""
    d = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((2048, 2048), dtype=np.float32), f"w{i}") for i in range(12)]
    nodes, prev = [], "x"
    for i in range(12):
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
        prev = f"h{i}"
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2048])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["N", 2048])], inits)
    p = d / "big.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p,
              save_as_external_data=True, location="big.data")
    return p


def _valid_entry(root: Path) -> bool:
    cfg = text_format.Parse((root / "config.pbtxt").read_text(), mc.ModelConfig())
    model = read_mcpir(root / "1" / "model.mcpir")  # verified: bounds, records, sizes
    return cfg.name == root.name and len(model.graph.initializers) == 12 and (root / "1" / "model.py").exists()


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.05, 0.3, 0.6, 0.9, 1.3])
def test_sigkill_leaves_old_output_or_nothing(big_model, tmp_path, delay):
    repo = tmp_path / "repo"
    cmd = [*CLI, "convert", "-i", str(big_model), "-t", T, "-o", str(repo), "--name", "big", "--force"]
    for round_ in range(2):  # first with nothing there, then over a previous good entry
        before = (repo / "big" / "1" / "model.mcpir").stat().st_mtime_ns if (repo / "big").exists() else None
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        entries = sorted(x.name for x in repo.iterdir() if x.is_dir()) if repo.exists() else []
        assert entries in ([], ["big"]), entries  # never a half entry or a stray folder
        if entries:
            assert _valid_entry(repo / "big")
        elif before is not None:
            pytest.fail("a killed --force convert removed the previous entry")
        if round_ == 0 and not entries:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)  # a good previous entry
    r = subprocess.run(cmd, capture_output=True, text=True)  # and a later run cleans up after the dead
    assert r.returncode == 0, r.stderr
    staging = tmp_path / ".repo.mcp-staging"
    assert not staging.exists()  # the dead converts' folders removed, then the empty staging folder


@pytest.mark.slow
def test_sigkill_plain_mcpir_output(big_model, tmp_path):
    out = tmp_path / "m.mcpir"
    subprocess.run([*CLI, "convert", "-i", str(big_model), "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
    good = out.read_bytes()
    for delay in (0.1, 0.4, 0.8):
        p = subprocess.Popen([*CLI, "convert", "-i", str(big_model), "-o", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert out.read_bytes() == good  # replaced atomically or not at all (same content)
        read_mcpir(out)


def test_concurrent_converts_into_one_repository(tmp_path):
    repo = tmp_path / "repo"
    src = GOLDEN / "convnet" / "model.onnx"
    procs = [subprocess.Popen([*CLI, "convert", "-i", str(src), "-t", T, "-o", str(repo), "--name", n, "--force"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for n in ("a", "b", "c", "same", "same", "same")]
    errs = [p.communicate()[1].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    assert sorted(x.name for x in repo.iterdir() if x.is_dir()) == ["a", "b", "c", "same"]
    for n in ("a", "b", "c", "same"):
        rep = verify(src, repo / n, dims={"H": 16, "W": 16})
        assert rep.ok
    # without --force, of several racing converts of one new name exactly one wins
    procs = [subprocess.Popen([*CLI, "convert", "-i", str(src), "-t", T, "-o", str(repo), "--name", "once"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(3)]
    codes = sorted(p.wait() for p in procs)
    assert codes == [0, 2, 2]


def test_outputs_are_byte_identical_across_processes(tmp_path):
    src = GOLDEN / "attention" / "model.onnx"
    trees = []
    for seed in ("0", "12345"):
        repo = tmp_path / f"repo{seed}"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([*CLI, "convert", "-i", str(src), "-t", T, "-o", str(repo), "--name", "m"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run([*CLI, "convert", "-i", str(src), "-o", str(tmp_path / f"m{seed}.mcpir")],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        trees.append({str(p.relative_to(repo)): p.read_bytes() for p in (repo / "m").rglob("*") if p.is_file()})
    assert trees[0] == trees[1]
    assert (tmp_path / "m0.mcpir").read_bytes() == (tmp_path / "m12345.mcpir").read_bytes()


NASTY = ['a"b', "line\nbreak", "sl/ash", "ünï©ødé", '"\n}\ninput {\n  name: "injected']


def test_interface_names_cannot_inject_into_config(tmp_path):
    nodes, outs, ins = [], [], []
    for name in NASTY:
        ins.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 2]))
        nodes.append(helper.make_node("Neg", [name], [f"{name}_out"]))
        outs.append(helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, ["N", 2]))
    g = helper.make_graph(nodes, "names", ins, outs)
    src = tmp_path / "names.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    compile_model(src, tmp_path / "repo", CompileOptions.for_target(T, "names"))
    cfg = text_format.Parse((tmp_path / "repo" / "names" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert [i.name for i in cfg.input] == NASTY  # escaped by protobuf, parsed back exactly
    assert len(cfg.input) == len(NASTY) and len(cfg.output) == len(NASTY)
    assert verify(src, tmp_path / "repo" / "names").ok
    assert sorted(p.name for p in (tmp_path / "repo").iterdir() if p.is_dir()) == ["names"]


UNARY = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Exp", "Identity"]
BINARY = ["Add", "Mul", "Sub", "Max", "Min"]


@st.composite
def random_models(draw):
    width = draw(st.integers(1, 6))
    nodes, inits, values = [], [], ["x"]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    for i in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["unary", "binary", "const", "matmul"]))
        a = draw(st.sampled_from(values))
        out = f"v{i}"
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(UNARY)), [a], [out]))
        elif kind == "binary":
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), [a, draw(st.sampled_from(values))], [out]))
        elif kind == "const":
            c = f"c{i}"
            inits.append(numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), c))
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), [a, c], [out]))
        else:
            w = f"w{i}"
            inits.append(numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) * 0.3, w))
            nodes.append(helper.make_node("MatMul", [a, w], [out]))
        values.append(out)
    outputs = draw(st.lists(st.sampled_from(values[1:]), min_size=1, max_size=2, unique=True))
    g = helper.make_graph(nodes, "rand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["N", width]) for o in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(random_models())
def test_random_graphs_convert_and_verify(tmp_path_factory, model):
    d = tmp_path_factory.mktemp("rand")
    onnx.save(model, d / "m.onnx")
    compile_model(d / "m.onnx", d / "repo", CompileOptions.for_target(T, "m", verify=True, dims={"N": 3}))


@pytest.mark.slow
def test_sigkill_while_the_weights_are_being_written(big_model, tmp_path):
    # Kill exactly when the staging folder holds a partial model.mcpir: proof the kill lands
    # mid-write, and that nothing of it reaches the repository.
    repo, staging = tmp_path / "repo", tmp_path / ".repo.mcp-staging"
    cmd = [*CLI, "convert", "-i", str(big_model), "-t", T, "-o", str(repo), "--name", "big", "--force"]
    for previous in (False, True):
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        partial = None
        while time.monotonic() < deadline and partial is None:
            partial = next((f for f in staging.glob("big.*.tmp/1/.model.mcpir.*.tmp") if f.stat().st_size > 0), None) \
                if staging.exists() else None
            time.sleep(0.002)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert partial is not None, "never saw the weights being written"
        dirs = sorted(x.name for x in repo.iterdir() if x.is_dir()) if repo.exists() else []
        assert dirs == (["big"] if previous else [])
        if previous:
            assert _valid_entry(repo / "big")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        assert _valid_entry(repo / "big")
