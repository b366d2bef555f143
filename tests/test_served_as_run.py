"""What is served is what the user runs (issue 59): the lowered ONNX declares inner shapes as the
original did, so that onnxruntime fuses it as it fuses the original."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

CLI = [sys.executable, "-m", "mcp_compiler.cli"]
D = 64


def _residual(declare: bool) -> onnx.ModelProto:
    """MatMul + bias + residual Add + LayerNormalization over a Reshape whose target is an input:
    onnxruntime's own inference cannot know the Add's shapes, so it fuses the Adds and the norm
    into SkipLayerNormalization only where value_info declares them (as exporters write them)."""
    rng = np.random.default_rng(0)
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", D])
    s = h.make_tensor_value_info("shape", T.INT64, [3])
    y = h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", D])
    inits = [nh.from_array((rng.standard_normal((D, D)) * 0.1).astype(np.float32), "W"),
             nh.from_array(rng.standard_normal(D).astype(np.float32), "b"),
             nh.from_array(rng.uniform(0.5, 1.5, D).astype(np.float32), "g"),
             nh.from_array(rng.standard_normal(D).astype(np.float32) * 0.1, "be")]
    nodes = [h.make_node("Reshape", ["x", "shape"], ["xr"]), h.make_node("MatMul", ["xr", "W"], ["mm"]),
             h.make_node("Add", ["mm", "b"], ["biased"]), h.make_node("Add", ["biased", "xr"], ["res"]),
             h.make_node("LayerNormalization", ["res", "g", "be"], ["y"], axis=-1, epsilon=1e-5)]
    vi = [h.make_tensor_value_info(n, T.FLOAT, ["batch", "seq", D]) for n in ("xr", "mm", "biased", "res")]
    return h.make_model(h.make_graph(nodes, "g", [x, s], [y], inits, value_info=vi if declare else []),
                        opset_imports=[h.make_opsetid("", 17)])


def _fused(model: bytes | str, tmp_path, folder=None) -> list[str]:
    """The op types onnxruntime (default optimization) runs the model as."""
    import os

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    so.log_severity_level = 3
    here = os.getcwd()
    try:
        if folder is not None:   # a runtime's proto names its weights in model.mcpir beside it
            os.chdir(folder)
        ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    finally:
        os.chdir(here)
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node]


@pytest.mark.parametrize("declare", [True, False])
def test_the_lowered_model_fuses_as_the_original(tmp_path, declare):
    """The lowered ONNX had no value_info at all (0 against 1,421 in a TTS model): onnxruntime's
    SkipLayerNormalization no longer applied and a dynamic-int8 model's roundings flipped. Now the
    .onnx written and the model the runtime serves are fused as the original is, either way;
    where the original declared nothing, nothing is declared (a fusion the user's run does not
    make was 10% slower on an encoder here)."""
    from mcp_compiler.targets.triton.verify import load_runtime

    src = tmp_path / "m.onnx"
    onnx.save(_residual(declare), src)
    want = _fused(str(src), tmp_path)
    assert ("SkipLayerNormalization" in want) == declare, want
    for args in (["-o", str(tmp_path / "out.onnx")], ["-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--name", "m"]):
        r = subprocess.run([*CLI, "convert", str(src), *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert (len(out.graph.value_info) > 0) == declare and not out.metadata_props   # nothing of ours leaks
    assert _fused(str(tmp_path / "out.onnx"), tmp_path) == want
    vdir = tmp_path / "repo" / "m" / "1"
    rt = load_runtime(vdir)
    served = rt.MCPIRModel(vdir / "model.mcpir", keep_proto=True)
    assert _fused(served.onnx_bytes, tmp_path, folder=vdir) == want
    # and the numbers are the original's, bit for bit, where the same kernels run
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 5, D)).astype(np.float32),
             "shape": np.array([2, 5, D], np.int64)}
    orig = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(served.run(feeds)[0], orig)


def test_a_models_own_key_does_not_declare_for_it(tmp_path):
    """The key that says so is the frontend's: a model that carries it in its metadata without
    any value_info gets none declared (and the key is not written back)."""
    m = _residual(False)
    m.metadata_props.add(key="mcp.declared_shapes", value="1")
    onnx.save(m, tmp_path / "m.onnx")
    r = subprocess.run([*CLI, "convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out.onnx")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert len(out.graph.value_info) == 0 and not out.metadata_props


def _conv():
    from _helpers import GOLDEN

    return str(GOLDEN / "convnet" / "model.onnx")


def test_the_designs_convert_command_is_accepted(tmp_path):
    """`convert --input M --output model.mcpir --target triton-v1.12 --dynamic-batch true` exited 2
    on every model. It writes the model lowered for the target with its serving settings recorded,
    says how to make the entry, and that entry takes them (a flag given then wins)."""
    import re

    from mcp_compiler.mcpir import read_mcpir

    out = tmp_path / "model.mcpir"
    r = subprocess.run([*CLI, "convert", "--input", _conv(), "--output", str(out), "--target", "triton-v1.12",
                        "--dynamic-batch", "true", "--max-batch-size", "16"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"its repository entry: mcp-cli convert {out} -t triton-v1.12 -o model_repository" in r.stderr + r.stdout
    props = read_mcpir(out).metadata_props
    assert props["mcp.target"] == "triton-v1.12" and '"max_batch_size": 16' in props["mcp.serving"]
    for extra, batch in (([], 16), (["--max-batch-size", "4"], 4)):
        repo = tmp_path / f"repo{batch}"
        r = subprocess.run([*CLI, "convert", str(out), "-t", "triton-v1.12", "-o", str(repo), "--name", "conv", *extra],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        cfg = (repo / "conv" / "config.pbtxt").read_text()
        assert re.search(rf"^max_batch_size: {batch}$", cfg, re.M) and "dynamic_batching {" in cfg, cfg
        assert "mcp.serving" not in cfg and "mcp.target" not in read_mcpir(repo / "conv" / "1" / "model.mcpir").metadata_props
    r = subprocess.run([*CLI, "verify", _conv(), str(tmp_path / "repo16" / "conv")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_lowered_mcpir_refuses_verify_and_bad_recorded_settings(tmp_path):
    from mcp_compiler.mcpir import read_mcpir
    from mcp_compiler.mcpir.writer import write_mcpir

    out = tmp_path / "model.mcpir"
    r = subprocess.run([*CLI, "convert", _conv(), "-o", str(out), "-t", "triton-v1.12", "--verify"],
                       capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--verify checks the entry a target serves" in lines[0], r.stderr
    assert not out.exists()
    r = subprocess.run([*CLI, "convert", _conv(), "-o", str(out), "-t", "triton-v1.12"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    for bad, text in (('{"max_batch_size": -3}', "max_batch_size"), ('{"nope": 1}', "unknown serving setting"),
                      ("[" * 5000, "recorded serving settings")):
        m = read_mcpir(out)
        m.metadata_props["mcp.serving"] = bad
        write_mcpir(m, tmp_path / "bad.mcpir")
        r = subprocess.run([*CLI, "convert", str(tmp_path / "bad.mcpir"), "-t", "triton-v1.12", "-o", str(tmp_path / "r")],
                           capture_output=True, text=True, timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and text in lines[0], (bad[:20], r.stderr)
        assert not (tmp_path / "r").exists()


def test_a_closed_stdout_is_not_an_internal_error(tmp_path):
    """`mcp-cli convert ... | head -1` printed `internal error: BrokenPipeError` twice."""
    r = subprocess.run(f"{sys.executable} -m mcp_compiler.cli convert {_conv()} -t triton-v1.12 -o {tmp_path / 'r'} "
                       "| true", shell=True, capture_output=True, text=True, timeout=300)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "r" / "model" / "config.pbtxt").is_file()


def test_an_output_whose_length_depends_on_precision_is_a_clear_refusal(tmp_path):
    """Issue 59: fp16 of a model whose output length depends on the precision ended in `internal
    error: operands could not be broadcast together with shapes (5181822,) (5184226,)`."""
    from mcp_compiler.accuracy import measure
    from mcp_compiler.errors import AccuracyError
    from mcp_compiler.frontend import load_onnx

    def kept(n: int) -> onnx.ModelProto:   # the first n values: a stand-in for "those above a threshold"
        inits = [nh.from_array(np.array([0], np.int64), "s"), nh.from_array(np.array([n], np.int64), "e")]
        g = h.make_graph([h.make_node("Slice", ["x", "s", "e"], ["y"])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [8])], [h.make_tensor_value_info("y", T.FLOAT, ["k"])],
                         inits)
        return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(kept(5), tmp_path / "original.onnx")
    onnx.save(kept(6), tmp_path / "fp16.onnx")
    samples = [{"x": np.arange(8, dtype=np.float32)}]
    with pytest.raises(AccuracyError, match=r"output 'y' has shape \[6\] where the original's is \[5\].*no budget"):
        measure(tmp_path / "original.onnx", load_onnx(tmp_path / "fp16.onnx").model, samples, "1 sample")
