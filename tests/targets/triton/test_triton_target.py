"""`convert --target triton-v1.12`: repository layout, config from the contract, safety of outputs."""

from __future__ import annotations

import json
import re

import onnx
import pytest
from _helpers import GOLDEN, ZOO_INPUTS, zoo_models
from google.protobuf import text_format
from onnx import TensorProto, helper
from tritonclient.grpc import model_config_pb2 as mc
from typer.testing import CliRunner

from mcp_compiler.cli import app
from mcp_compiler.targets.triton.config import sanitize_name

runner = CliRunner()
T = "triton-v1.12"
MLP = GOLDEN / "mlp" / "model.onnx"


def _convert(*args: str):
    return runner.invoke(app, ["convert", *args])


def _config(path) -> mc.ModelConfig:
    return text_format.Parse((path / "config.pbtxt").read_text(), mc.ModelConfig())


def test_targets_lists_triton():
    r = runner.invoke(app, ["targets", "--json"])
    assert r.exit_code == 0
    out = json.loads(r.output)
    assert out["ok"] and [t["name"] for t in out["targets"]] == [T, "onnx"]
    assert {"serve", "deploy", "verify", "status", "undeploy"} <= set(out["targets"][0]["commands"])


def test_unknown_target_lists_known(tmp_path):
    r = _convert("-i", str(MLP), "-t", "tensorrt", "-o", str(tmp_path))
    assert r.exit_code == 2 and "unknown target 'tensorrt'; known targets: onnx, triton-v1.12" in r.output


def test_python_backend_repository(tmp_path):
    r = _convert("-i", str(MLP), "-t", T, "-o", str(tmp_path / "repo"), "--name", "mlp", "--verify")
    assert r.exit_code == 0, r.output
    root = tmp_path / "repo" / "mlp"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == ["1/mcp_runtime/__init__.py", "1/mcp_runtime/decoder.py", "1/mcp_runtime/engine.py",
                     "1/mcp_runtime/lifetime.py", "1/mcp_runtime/mcp_ir.fbs", "1/mcp_runtime/mcp_ir_generated.py", "1/mcp_runtime/params.py",
                     "1/mcp_runtime/runtime.py", "1/mcp_runtime/sequences.py", "1/mcp_runtime/telemetry.py",
                     "1/mcp_runtime/text.py", "1/mcp_runtime/verify.py",
                     "1/model.mcpir", "1/model.py", "config.pbtxt"]
    cfg = _config(root)
    assert cfg.name == "mlp" and cfg.backend == "python"
    # batch symbol N on every input and output: dynamic batching, batch axis left out of dims
    assert cfg.max_batch_size == 8 and cfg.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("x", mc.TYPE_FP32, [16])]
    assert [(o.name, list(o.dims)) for o in cfg.output] == [("y", [10])]
    assert cfg.parameters["quantization_level"].string_value == "none"
    assert "max abs 0," in r.output  # verify ran on the emitted runtime: bit-exact


def test_default_repository_and_name_from_stem(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "My Model v2.onnx"
    src.write_bytes(MLP.read_bytes())
    assert _convert("-i", str(src), "-t", T).exit_code == 0
    assert (tmp_path / "model_repository" / "My_Model_v2" / "config.pbtxt").exists()
    assert sanitize_name("../../etc") == "_.._etc"


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "-x", ""])
def test_bad_names_rejected(tmp_path, name):
    r = _convert("-i", str(MLP), "-t", T, "-o", str(tmp_path / "repo"), "--name", name)
    assert r.exit_code == 2 and "is not accepted" in r.output
    assert not any((tmp_path / "repo").rglob("*.pbtxt")) if (tmp_path / "repo").exists() else True
    assert not (tmp_path / "x").exists()


def test_existing_entry_needs_force_and_failures_keep_it(tmp_path):
    repo = tmp_path / "repo"
    args = ["-i", str(MLP), "-t", T, "-o", str(repo), "--name", "m"]
    assert _convert(*args).exit_code == 0
    before = (repo / "m" / "1" / "model.mcpir").read_bytes()
    r = _convert(*args)
    assert r.exit_code == 2 and "pass --force" in r.output
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08garbage")
    assert _convert("-i", str(bad), "-t", T, "-o", str(repo), "--name", "m", "--force").exit_code == 2
    assert (repo / "m" / "1" / "model.mcpir").read_bytes() == before
    assert _convert(*args, "--force", "--max-batch-size", "4").exit_code == 0
    assert _config(repo / "m").max_batch_size == 4
    # no temp folders left, in the repository (Triton would try to load them) or in staging
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == ["m"]
    assert not (tmp_path / ".repo.mcp-staging").exists()  # an empty staging folder is removed too


def _state_model(tmp_path):
    # An RNN-like state input with its batch at axis 1: blocks dynamic batching.
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "h"], ["y"])], "state",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, "batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "batch", 4])])
    p = tmp_path / "state.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


def test_batch_blocker_warns_and_forcing_fails(tmp_path):
    src = _state_model(tmp_path)
    r = _convert("-i", str(src), "-t", T, "-o", str(tmp_path / "repo"))
    assert r.exit_code == 0
    assert "dynamic batching off" in r.output and "input 'h'" in r.output and "axis 1" in r.output
    cfg = _config(tmp_path / "repo" / "state")
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert list(cfg.input[1].dims) == [1, -1, 4]
    r = _convert("-i", str(src), "-t", T, "-o", str(tmp_path / "repo2"), "--dynamic-batch", "true")
    assert r.exit_code == 2 and "cannot batch this model" in r.output
    assert not (tmp_path / "repo2" / "state").exists()
    r = _convert("-i", str(MLP), "-t", T, "-o", str(tmp_path / "r3"), "--no-dynamic-batch")
    assert _config(tmp_path / "r3" / "model").max_batch_size == 0


def test_build_file_and_flags(tmp_path):
    cfg_file = tmp_path / "mcp.yaml"
    cfg_file.write_text("max_batch_size: 32\npreferred_batch_size: [4, 8]\nmax_queue_delay_us: 500\n"
                        "max_concurrent_requests: 64\ninference_timeout_ms: 250\ninstance_count: 2\n"
                        "model_warmup: true\n")
    r = _convert("-i", str(MLP), "-t", T, "-o", str(tmp_path / "repo"), "--config", str(cfg_file),
                 "--instance-count", "3")
    assert r.exit_code == 0, r.output
    cfg = _config(tmp_path / "repo" / "model")
    assert cfg.max_batch_size == 32
    db = cfg.dynamic_batching
    assert list(db.preferred_batch_size) == [4, 8] and db.max_queue_delay_microseconds == 500
    q = db.default_queue_policy
    assert q.max_queue_size == 64 and q.default_timeout_microseconds == 250_000
    assert q.timeout_action == mc.ModelQueuePolicy.REJECT
    assert cfg.instance_group[0].count == 3 and cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    # one warm-up per preferred batch size, at sizes the model accepts
    assert [w.batch_size for w in cfg.model_warmup] == [4, 8]
    w = cfg.model_warmup[0]
    assert list(w.inputs["x"].dims) == [16] and w.inputs["x"].random_data


@pytest.mark.parametrize("text, expect", [
    ("max_batch: 4\n", "line 1: unknown key 'max_batch'"),
    ("kind: cpu\nmax_batch_size: many\n", "line 2: max_batch_size must be a int"),
    ("kind: tpu\n", "kind must be cpu or gpu"),
    ("tensor_parallel_size: 2\n", "needs kind: gpu"),
    ("[1, 2\n", "not valid YAML"),
    ("quantization_level: int3\n", "quantization_level must be one of"),
])
def test_build_file_errors(tmp_path, text, expect):
    cfg_file = tmp_path / "mcp.yaml"
    cfg_file.write_text(text)
    r = _convert("-i", str(MLP), "-t", T, "-o", str(tmp_path / "repo"), "--config", str(cfg_file))
    assert r.exit_code == 2 and expect in r.output, r.output
    assert not (tmp_path / "repo" / "model").exists()


def test_gpu_tensor_parallel_placement(tmp_path):
    r = _convert("-i", str(MLP), "-t", T, "-o", str(tmp_path / "repo"), "--kind", "gpu",
                 "--tensor-parallel-size", "2")
    assert r.exit_code == 0, r.output
    g = _config(tmp_path / "repo" / "model").instance_group[0]
    assert g.kind == mc.ModelInstanceGroup.KIND_GPU and list(g.gpus) == [0, 1]


def test_onnxruntime_backend(tmp_path):
    src = zoo_models()[2]  # the direction classifier
    r = _convert("-i", str(src), "-t", T, "-o", str(tmp_path / "repo"), "--backend", "onnxruntime",
                 "--verify", "--dims", "x_d0=1")
    assert r.exit_code == 0, r.output
    root = tmp_path / "repo" / src.stem.replace(".", ".")
    root = next((tmp_path / "repo").iterdir())
    cfg = _config(root)
    assert cfg.platform == "onnxruntime_onnx" and cfg.backend == "onnxruntime"
    assert (root / "1" / "model.onnx").exists() and not (root / "1" / "model.py").exists()


def test_verify_catches_a_wrong_model(tmp_path):
    repo = tmp_path / "repo"
    assert _convert("-i", str(MLP), "-t", T, "-o", str(repo), "--name", "m").exit_code == 0
    # Put another model's repository entry in its place: same interface, other weights.
    other = GOLDEN / "mlp" / "model.onnx"
    m = onnx.load(other)
    w = onnx.numpy_helper.to_array(m.graph.initializer[0]) * 1.5
    m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w, m.graph.initializer[0].name))
    onnx.save(m, tmp_path / "other.onnx")
    r = runner.invoke(app, ["verify", "-i", str(tmp_path / "other.onnx"), "-r", str(repo / "m")])
    assert r.exit_code == 1 and "differs from onnxruntime" in r.output
    r = runner.invoke(app, ["verify", "-i", str(MLP), "-r", str(repo / "m"), "--samples", "3", "--json"])
    rep = json.loads(r.output)
    assert r.exit_code == 0 and rep["ok"] and rep["outputs"][0]["cosine"] == pytest.approx(1.0)


def test_verify_on_zoo_models(tmp_path):
    # each model's own symbols (`mcp-cli inspect` shows them; an unknown one is an error)
    symbols = {"det": ("p2o.DynamicDimension.0", "p2o.DynamicDimension.1", "p2o.DynamicDimension.2"),
               "rec": ("p2o.DynamicDimension.0", None, "p2o.DynamicDimension.1"), "cls": ("x_d0", "x_d2", "x_d3")}
    for src in zoo_models():
        n, c, h, w = ZOO_INPUTS[src.name]
        names = next(v for k, v in symbols.items() if k in src.name)
        dims = ",".join(f"{k}={v}" for k, v in zip(names, (n, h, w)) if k)
        r = _convert("-i", str(src), "-t", T, "-o", str(tmp_path / "repo"), "--verify", "--dims", dims)
        assert r.exit_code == 0, r.output


def test_onnx_output_with_target_is_a_usage_error(tmp_path):
    """(An .mcpir output with the target is the model lowered for it: tests/test_served_as_run.py.)"""
    r = _convert("-i", str(MLP), "-t", T, "-o", str(tmp_path / "x.onnx"))
    assert r.exit_code == 2 and "model repository folder" in r.output and not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("level", ["int4", "fp8"])
@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
def test_quantized_repository(tmp_path, level, backend):
    from _helpers import mlp_onnx

    src = mlp_onnx(tmp_path / "big_mlp.onnx")
    repo = tmp_path / "repo"
    r = _convert("-i", str(src), "-t", T, "-o", str(repo), "--quantize", level, "--backend", backend, "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output)["quantization"]["quantized"]) == 4
    cfg = _config(repo / "big_mlp")
    assert cfg.parameters["quantization_level"].string_value == level
    assert [i.data_type for i in cfg.input] == [mc.TYPE_FP32]   # Triton I/O stays float
    # the repository's own runtime (or Triton's onnxruntime backend's model.onnx) runs it; verify
    # judges it by its level's accuracy budget on 16 samples, not by float32 tolerances
    r = runner.invoke(app, ["verify", "-i", str(src), "-r", str(repo / "big_mlp"), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["budget"] == {"cos": 0.98 if level == "int4" else 0.99} and out["samples"] == 16
    cos = out["outputs"][0]["cosine"]
    assert out["outputs"][0]["cosine"] < 1.0 and out["outputs"][0]["max_abs"] > 0   # not float-exact
    # a budget it misses: exit 1, naming the budget and the worst sample's cosine
    r = runner.invoke(app, ["verify", "-i", str(src), "-r", str(repo / "big_mlp"), "--accuracy-budget",
                            f"cos={min(1.0, cos + (1 - cos) / 2):.12f}"])
    assert r.exit_code == 1 and "outside the accuracy budget" in r.output and "the worst of 16 samples" in r.output
    assert re.search(r"cosine [0-9.]+ < cos=", r.output), r.output   # the criterion that failed, value and bound
    # a relative-error budget names the relative error, its value and its bound
    r = runner.invoke(app, ["verify", "-i", str(src), "-r", str(repo / "big_mlp"), "--accuracy-budget",
                            "cos=0,rel=1e-9"])
    assert r.exit_code == 1 and re.search(r"relative error [0-9.e-]+ > rel=1e-09", r.output), r.output


def test_quantization_level_in_build_file_quantizes(tmp_path):
    from _helpers import mlp_onnx

    src = mlp_onnx(tmp_path / "big_mlp.onnx")
    (tmp_path / "mcp.yaml").write_text("quantization_level: fp8\n")
    r = _convert("-i", str(src), "-t", T, "-o", str(tmp_path / "repo"), "--config", str(tmp_path / "mcp.yaml"))
    assert r.exit_code == 0 and "quantized fp8: 4 weights" in r.output, r.output


def test_convert_from_mcpir_input(tmp_path):
    ir = tmp_path / "mlp.mcpir"
    assert _convert("-i", str(MLP), "-o", str(ir)).exit_code == 0
    r = _convert("-i", str(ir), "-t", T, "-o", str(tmp_path / "repo"))
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["verify", "-i", str(MLP), "-r", str(tmp_path / "repo" / "mlp")])
    assert r.exit_code == 0 and "max abs 0," in r.output
    r = _convert("-i", str(ir), "-t", T, "-o", str(tmp_path / "repo2"), "--verify")
    assert r.exit_code == 2 and "give the .onnx" in r.output


def test_unknown_operator_domain_is_unsupported(tmp_path):
    g = helper.make_graph([helper.make_node("Op", ["x"], ["y"], domain="com.evil", name="n1")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.evil", 1)])
    onnx.save(m, tmp_path / "evil.onnx")
    r = _convert("-i", str(tmp_path / "evil.onnx"), "-t", T, "-o", str(tmp_path / "repo"))
    assert r.exit_code == 1
    assert "no operator domain 'com.evil' (node 'n1', op com.evil.Op)" in r.output


def test_a_batch_only_value_travels_as_batch_by_one(tmp_path):
    """A batching model's [N] value (sequence lengths beside [N, T] data, as real recognizers
    and diacritizers take): Triton needs a dim past the batch, so it travels as [N, 1] and the
    config's reshape gives the model [N]; deploy's smoke request is shaped to match."""
    from mcp_compiler.targets.triton.entry import Entry
    from mcp_compiler.targets.triton.lifecycle import smoke_inputs

    nodes = [helper.make_node("Cast", ["lengths"], ["lf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["lf", "one"], ["l2"]),
             helper.make_node("Mul", ["x", "l2"], ["y"]),
             helper.make_node("Identity", ["lengths"], ["lengths_out"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                                       helper.make_tensor_value_info("lengths", TensorProto.INT64, ["N"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
                           helper.make_tensor_value_info("lengths_out", TensorProto.INT64, ["N"])],
                          [helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    r = _convert(str(tmp_path / "m.onnx"), "-t", T, "-o", str(tmp_path / "repo"), "--name", "m")
    assert r.exit_code == 0, r.output
    cfg = _config(tmp_path / "repo" / "m")
    assert cfg.max_batch_size > 0
    by_name = {v.name: v for v in [*cfg.input, *cfg.output]}
    for name in ("lengths", "lengths_out"):
        assert list(by_name[name].dims) == [1] and by_name[name].HasField("reshape")
        assert list(by_name[name].reshape.shape) == []
    assert not by_name["x"].HasField("reshape")
    feeds = smoke_inputs(Entry.read(tmp_path / "repo" / "m"))
    assert feeds["lengths"].shape == (1, 1) and feeds["x"].shape == (1, 4)
    # and so is bench NAME --url's request, from the server's config alone (it sent [1]: every request failed)
    from mcp_compiler.targets.triton.bench import _remote_feeds

    feeds, _ = _remote_feeds(cfg, None, 3, {}, 128)
    assert feeds["lengths"].shape == (3, 1) and feeds["x"].shape == (3, 4)


def test_the_runtimes_parameters_have_one_home():
    """Every key of an entry's parameters that the runtime reads is spelled in runtime/params.py
    only (the config builder, verify, deploy, tune and kserve use its names), and read() types them."""
    import re
    from pathlib import Path

    from mcp_compiler.targets.triton.runtime import params as P

    # "mcp_runtime" is also the runtime package's folder name: as a key it is read by subscript or get()
    keys = {v for k, v in vars(P).items() if k.isupper() and isinstance(v, str)} - {P.RUNTIME}
    here = Path(P.__file__).parent.parent
    for f in sorted(here.rglob("*.py")):
        if f.name == "params.py" and f.parent.name == "runtime":
            continue
        text = f.read_text()
        spelled = [k for k in keys if re.search(rf'["\']{k}["\']', text)]
        spelled += [P.RUNTIME] if re.search(rf'(\[|get\(|in cfg\.parameters)\s*["\']{P.RUNTIME}["\']|["\']{P.RUNTIME}["\'] in ', text) else []
        assert not spelled, f"{f.relative_to(here)} spells {spelled}: use runtime/params.py's names"
    p = P.read({P.INTRA_OP_THREADS: "4", P.STATE: '[["h", "hn"]]', P.DEQUANTIZE_AT_LOAD: "TRUE"})
    assert (p.intra_op_threads, p.state, p.dequantize_at_load, p.execution, p.max_sequences) == \
        (4, [["h", "hn"]], True, "onnxruntime", 1024)
    with pytest.raises(ValueError, match=P.INTRA_OP_THREADS):
        P.read({P.INTRA_OP_THREADS: "٣"})


def test_verify_warns_when_a_declared_output_shape_is_not_what_the_model_returns(tmp_path):
    """A declared output shape [-1] while the server returns [T, 3] was kept without a warning."""
    import shutil

    from mcp_compiler.targets.triton.verify import verify

    repo = tmp_path / "repo"
    r = runner.invoke(app, ["convert", str(GOLDEN / "mlp" / "model.onnx"), "-t", "triton-v1.12", "-o", str(repo),
                            "--name", "mlp"])
    assert r.exit_code == 0, r.output
    good = verify(GOLDEN / "mlp" / "model.onnx", repo / "mlp")
    assert good.ok and good.warnings == []
    bad = tmp_path / "bad" / "mlp"
    shutil.copytree(repo / "mlp", bad)
    cfg = bad / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("output {\n  name: \"y\"\n  data_type: TYPE_FP32\n  dims: 10\n",
                                           "output {\n  name: \"y\"\n  data_type: TYPE_FP32\n  dims: 10\n  dims: 3\n"))
    got = verify(GOLDEN / "mlp" / "model.onnx", bad)
    assert got.ok and len(got.warnings) == 1, got.warnings
    assert "output 'y': the config declares dims [-1, 10, 3] but the model returns shape" in got.warnings[0]
    r = runner.invoke(app, ["verify", str(GOLDEN / "mlp" / "model.onnx"), str(bad)])
    assert r.exit_code == 0 and "warning: output 'y'" in r.output, r.output


def _entry_config(tmp_path, graph, name: str) -> mc.ModelConfig:
    """`graph` (opset 17) converted to tmp_path/repo/NAME; its config."""
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    r = runner.invoke(app, ["convert", str(tmp_path / "m.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                            "--name", name])
    assert r.exit_code == 0, r.output
    return _config(tmp_path / "repo" / name)


def test_the_config_records_a_request_the_model_accepts_and_bench_url_sends_it(tmp_path):
    """A client with only the server's config (bench NAME --url) guessed integers in [0, 3): an
    index into a 2-row table was out of range. The entry records the request its checks send."""
    import numpy as np

    from mcp_compiler.targets.triton.bench import _remote_feeds
    from mcp_compiler.targets.triton.runtime import params as P

    table = helper.make_tensor("table", TensorProto.FLOAT, [2, 4], np.arange(8, dtype=np.float32).tolist())
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "T"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 4])], [table])
    cfg = _entry_config(tmp_path, g, "emb")
    request = P.of_config(cfg).request
    assert request["ids"]["values"] == ["range", 0, 2] and request["ids"]["shape"][0] == 1, request
    feeds, notes = _remote_feeds(cfg, None, 4, {}, 128)
    assert feeds["ids"].shape[0] == 4 and feeds["ids"].dtype == np.int64
    assert 0 <= feeds["ids"].min() and feeds["ids"].max() <= 1 and "the request the entry records" in notes[0]
    feeds, _ = _remote_feeds(cfg, None, 1, {"*": 5}, 128)   # --dims: the config's -1 dims as before
    assert feeds["ids"].shape == (1, 5)


def test_a_length_the_server_refuses_is_retried_at_others(tmp_path):
    """silero_vad's window needs 256 samples inside an If on the sample rate: no static contract
    says so, and every request at the default 128 failed. bench --url tries the recorded request
    once; refused, it tries other lengths and says which one it measures at."""
    from mcp_compiler.targets.triton.bench import RETRY_LENGTHS, _remote_feeds

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T"])])
    cfg = _entry_config(tmp_path, g, "vad")
    asked = []

    def accepts(feeds):
        asked.append(feeds["x"].shape[1])
        return feeds["x"].shape[1] >= 512
    feeds, notes = _remote_feeds(cfg, None, 1, {}, 128, accepts)
    assert feeds["x"].shape == (1, 512) and asked == [128, 256, 512]
    assert "free axes at 512 (the server refused 128)" in notes[0]
    asked.clear()
    feeds, notes = _remote_feeds(cfg, None, 1, {}, 128, lambda f: asked.append(1) or False)
    assert feeds["x"].shape == (1, 128) and len(asked) == 1 + len(RETRY_LENGTHS)   # none taken: as recorded
    assert "refused" not in notes[0]


def test_an_axis_the_shape_contracts_bound_is_not_free_in_the_recorded_request(tmp_path):
    """A text recognizer's height must come to 1 after its strides (PP-OCRv4 rec: 33..80), though
    no op ties it to one size: bench --url sent it at 128 and every request failed. The recorded
    request marks free only the axes whose contracts hold at the request length."""
    import numpy as np

    from mcp_compiler.targets.triton.bench import _remote_feeds
    from mcp_compiler.targets.triton.runtime import params as P

    one = helper.make_tensor("one", TensorProto.FLOAT, [1, 1, 1, 1], [1.0])
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[3, 1], strides=[16, 1]),
             helper.make_node("Expand", ["one", "s"], ["o"]),
             helper.make_node("Concat", ["p", "o"], ["y"], axis=3)]
    shape = helper.make_tensor("s", TensorProto.INT64, [4], [1, 1, 1, 1])
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, "W1"])], [one, shape])
    cfg = _entry_config(tmp_path, g, "rec")
    request = P.of_config(cfg).request
    assert request["x"]["free"] == [3], request   # W is free; H is held to 3..18 by the pool and the Concat
    feeds, _ = _remote_feeds(cfg, None, 1, {}, 128)
    h = feeds["x"].shape[2]
    assert feeds["x"].shape[3] == 128 and (h - 3) // 16 + 1 == 1, feeds["x"].shape
    assert np.isfinite(feeds["x"]).all()
