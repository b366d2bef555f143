"""`mcp-cli bench` and `mcp-cli tune` on a real tritonserver on 127.0.0.1 (the golden MLP)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from _helpers import GOLDEN, raising_copy

from mcp_compiler import CompileOptions, compile_model

pytestmark = pytest.mark.slow  # a real Triton

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver to measure")

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def _cli(*args: str):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def entry(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    compile_model(GOLDEN / "mlp" / "model.onnx", d / "repo", CompileOptions.for_target("triton-v1.12", "mlp"))
    return d / "repo" / "mlp"


def test_bench_closed_and_open_loop(entry, tmp_path):
    csv = tmp_path / "points.csv"
    r = _cli("bench", str(entry), "--concurrency", "1,4", "--rate", "200", "--seconds", "1.5", "--batch-size", "2",
             "--csv", str(csv), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["batch_size"] == 2
    points = out["points"]
    assert [p["load"] for p in points] == ["concurrency 1", "concurrency 4", "rate 200/s"]
    for p in points:
        assert p["requests"] > 0 and p["errors"] == 0 and p["throughput"] > 0
        assert p["infer_per_s"] == pytest.approx(2 * p["throughput"], rel=0.01)
        assert 0 < p["p50_ms"] <= p["p90_ms"] <= p["p99_ms"]
        # the server's own split, from its statistics extension
        assert p["compute_ms"] > 0 and p["queue_ms"] >= 0 and p["avg_batch"] >= 1
        assert 0 <= p["client_cpu"] < 2
    # open loop at 200/s over 1.5 s: the arrivals are Poisson, the count near 300
    assert 150 < points[2]["requests"] < 450
    assert csv.read_text().splitlines()[0].startswith("load,concurrency,rate,batch_size")
    assert len(csv.read_text().splitlines()) == 4


def test_bench_until_stable_and_against_a_running_server(entry):
    from mcp_compiler.targets.triton.bench import bench
    from mcp_compiler.targets.triton.client import Connection
    from mcp_compiler.targets.triton.loadgen import Load
    from mcp_compiler.targets.triton.serve import TritonServer

    with TritonServer(entry.parent) as server:
        r = bench("mlp", [Load(concurrency=2)], Connection(server.grpc_url), window_s=0.5, max_windows=8)
    p = r.points[0]
    assert p.windows >= 3 and p.stable in (True, False) and p.requests > 0 and p.errors == 0
    # a model known only by name: requests made from the server's config, and said so
    assert any("server's config" in n for n in r.notes)


def test_bench_bad_input(entry, tmp_path):
    r = _cli("bench", str(entry), "--concurrency", "0")
    assert r.returncode == 2 and "--concurrency" in r.stderr
    r = _cli("bench", str(tmp_path), "--seconds", "1")
    assert r.returncode == 2 and "not a model repository entry" in r.stderr
    r = _cli("bench", "mlp", "--url", "127.0.0.1:1", "--seconds", "1")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "127.0.0.1:1" in r.stderr, r.stderr


def test_bench_where_every_request_fails_is_exit_1(entry, tmp_path):
    broken = raising_copy(entry, tmp_path / "repo" / "mlp", "execute", "no inference here")
    r = _cli("bench", str(broken), "--concurrency", "1", "--seconds", "0.5", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["error"]["type"] == "BenchFailedError", r.stdout + r.stderr
    assert "every request failed" in out["error"]["message"] and "no inference here" in out["error"]["message"]


def test_tune_finds_a_setting_and_applies_it(entry, tmp_path):
    work = tmp_path / "repo" / "mlp"
    shutil.copytree(entry, work)
    before = (work / "config.pbtxt").read_text()
    report, plot = tmp_path / "r.json", tmp_path / "p.png"
    r = _cli("tune", str(work), "--slo-p99-ms", "1000", "--concurrency", "4", "--budget-s", "900",
             "--window-s", "0.5", "--report", str(report), "--plot", str(plot), "--apply")
    assert r.returncode == 0, r.stderr
    assert "baseline:" in r.stderr and "trial 1:" in r.stderr   # progress
    rep = json.loads(report.read_text())
    for key in ("config", "throughput", "p50_ms", "p99_ms"):
        assert key in rep["baseline"] and key in rep["best"]
    assert len(rep["trials"]) >= 3 and rep["spent_s"] <= rep["budget_s"]   # (a budget no stage reaches: not timed)
    assert all(t["peak_rss_mb"] and t["peak_rss_mb"] > 30 for t in rep["trials"] if t["throughput"])
    best = max((t for t in rep["trials"] if t["meets_slo"]), key=lambda t: t["throughput"])
    assert rep["best"]["throughput"] == best["throughput"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    after = (work / "config.pbtxt").read_text()
    assert rep["inputs"] == {"x": {"shape": [1, 16], "dtype": "float32"}}
    c = rep["best"]["confirmation"]
    if rep["best"]["config"] != rep["baseline"]["config"]:
        # re-measured in alternating pairs; applied exactly when the interval clears 1 + margin
        assert c is not None and len(c["pairs"]) >= 3, c
        lo, hi = c["interval"]
        assert lo <= c["median_ratio"] <= hi and c["confirmed"] == (lo > 1 + c["margin"]) and c["applied"] == c["confirmed"]
        assert [p["first"] for p in c["pairs"][:2]] == ["baseline", "best"]
        assert bool(rep["applied"]) == c["confirmed"] and (after != before) == c["confirmed"]
        if c["confirmed"]:
            from google.protobuf import text_format
            from tritonclient.grpc import model_config_pb2 as mc

            cfg = text_format.Parse(after, mc.ModelConfig())
            assert cfg.instance_group[0].count == rep["best"]["config"]["instance_count"]
            assert cfg.HasField("dynamic_batching") == rep["best"]["config"]["dynamic_batching"]
        else:
            assert "no configuration beat the baseline beyond noise" in r.stdout
    else:
        assert after == before


def test_tune_slo_not_met_and_bad_budget(entry, tmp_path):
    r = _cli("tune", str(entry), "--slo-p99-ms", "0.001", "--concurrency", "2", "--budget-s", "12",
             "--window-s", "0.3", "--report", str(tmp_path / "r.json"))
    assert r.returncode == 1 and "no trial met p99 <= 0.001 ms" in r.stderr and "best p99 seen" in r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["best"] is None
    assert all(f"note: {n}" in r.stderr for n in rep["notes"]), (rep["notes"], r.stderr)   # not only the report
    r = _cli("tune", str(entry), "--slo-p99-ms", "5", "--budget-s", "1")
    assert r.returncode == 2 and "too small for one trial" in r.stderr


def test_tune_turns_batching_on_for_an_entry_written_without(tmp_path):
    """An MLP converted with --dynamic-batch false (max_batch_size 0, the batch dim in the dims):
    its model has one batch symbol everywhere, so tune tries batching, and --apply writes the
    batched form (leading dim dropped) when a batched trial wins."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    repo = tmp_path / "repo"
    compile_model(GOLDEN / "mlp" / "model.onnx", repo, CompileOptions.for_target(
        "triton-v1.12", "mlp", settings={"dynamic_batch": False}))
    report = tmp_path / "r.json"
    r = _cli("tune", str(repo / "mlp"), "--slo-p99-ms", "1000", "--concurrency", "8", "--budget-s", "900",
             "--window-s", "0.3", "--report", str(report), "--apply")
    assert r.returncode == 0, r.stderr
    rep = json.loads(report.read_text())
    assert rep["baseline"]["config"]["max_batch_size"] == 0
    batched = [t for t in rep["trials"] if t["config"]["dynamic_batching"]]
    assert batched and all(t["config"]["max_batch_size"] > 0 and t["errors"] == 0 for t in batched)
    cfg = text_format.Parse((repo / "mlp" / "config.pbtxt").read_text(), mc.ModelConfig())
    if rep["applied"]:
        assert rep["best"]["confirmation"]["confirmed"]
        if rep["best"]["config"]["dynamic_batching"]:
            assert cfg.max_batch_size > 0 and list(cfg.input[0].dims) == [16]
    else:
        assert cfg.max_batch_size == 0
    # the entry still serves what it says
    b = _cli("bench", str(repo / "mlp"), "--concurrency", "2", "--seconds", "0.5", "--json")
    assert b.returncode == 0 and json.loads(b.stdout)["points"][0]["errors"] == 0, b.stderr


def _text_model(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    emb = numpy_helper.from_array(np.random.default_rng(0).standard_normal((1000, 32)).astype(np.float32), "emb")
    g = helper.make_graph([helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
                           helper.make_node("ReduceMean", ["e"], ["pooled"], axes=[1], keepdims=0)], "text",
                          [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
                          [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 32])], [emb])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_bench_sends_a_realistic_length_local_and_remote(tmp_path):
    """A text model [batch, sequence]: the request is sent at sequence 128 (not 1), locally and from
    a running server's config alone; --dims changes it; the shapes are in the JSON."""
    from mcp_compiler.targets.triton.serve import TritonServer

    repo = tmp_path / "repo"
    compile_model(_text_model(tmp_path / "text.onnx"), repo, CompileOptions.for_target("triton-v1.12", "text"))
    r = _cli("bench", str(repo / "text"), "-c", "2", "--seconds", "0.5", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["inputs"] == {"input_ids": {"shape": [1, 128], "dtype": "int64"}}, out["inputs"]
    assert any("sequence = 128" in n for n in out["notes"])
    with TritonServer(repo) as s:
        r = _cli("bench", "text", "--url", f"grpc://{s.grpc_url}", "-c", "2", "--seconds", "0.5", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["inputs"]["input_ids"]["shape"] == [1, 128], r.stderr
        r = _cli("bench", "text", "--url", f"grpc://{s.grpc_url}", "-c", "2", "--seconds", "0.5", "--json",
                 "--dims", "input_ids.1=64")
        assert json.loads(r.stdout)["inputs"]["input_ids"]["shape"] == [1, 64]
        r = _cli("bench", "text", "--url", f"grpc://{s.grpc_url}", "--dims", "seq=64", "--seconds", "0.5")
        assert r.returncode == 2 and "input_ids.1" in r.stderr
        # open loop far past what the server does: saturated, with the SLO attainment
        r = _cli("bench", "text", "--url", f"grpc://{s.grpc_url}", "--rate", "40000", "--seconds", "1",
                 "--slo-p99-ms", "2", "--json")
        p = json.loads(r.stdout)["points"][0]
        assert p["saturated"] is True and 0 <= p["slo_attainment"] < 0.9 and p["slo_ms"] == 2, p
        r = _cli("bench", "text", "--url", f"grpc://{s.grpc_url}", "--rate", "20", "--seconds", "1", "--json")
        assert json.loads(r.stdout)["points"][0]["saturated"] is False


def test_tune_searches_the_execution_and_measures_each_kept_one(tmp_path):
    """With OpenVINO installed, tune's last stage profiles the executions and serves each one the
    profile keeps as a trial of its own (a regression: the stage handed the entry, not the
    execution, to the trial's setting, and tune stopped with an internal error)."""
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    compile_model(GOLDEN / "convnet" / "model.onnx", tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "cnn"))
    report = tmp_path / "r.json"
    r = _cli("tune", str(tmp_path / "repo" / "cnn"), "--slo-p99-ms", "2000", "--concurrency", "2",
             "--budget-s", "900", "--window-s", "0.3", "--report", str(report))
    assert r.returncode == 0, r.stderr
    assert "profiling the executions" in r.stderr
    rep = json.loads(report.read_text())
    assert all(f"note: {n}" in r.stderr for n in rep["notes"]), (rep["notes"], r.stderr)
    executions = [t["config"]["execution"] for t in rep["trials"]]
    assert executions[0] == "onnxruntime/f32" and any(x.startswith("openvino/") for x in executions), executions
