"""State pairs (mcp_compiler/state.py): an input a model reads its state from and the output of the
next state: through an LSTM's initial_h/Y_h, by names (in_cache0 -> out_cache0, state -> stateN), a
KV cache growing along its sequence axis; never the model's main input and output. Built models,
then the real streaming models of the zoo manifest."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import save_model, zoo_model
from onnx import TensorProto, helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.state import find_state_pairs

F = TensorProto.FLOAT


def _pairs(path):
    return {(p.input, p.output, p.kind, p.grows_axis) for p in find_state_pairs(load_onnx(path).model)}


def test_lstm_state_through_squeeze_and_unsqueeze(tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((1, 4 * 8, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 4 * 8, 8)).astype(np.float32), "R"),
             numpy_helper.from_array(np.array([0], np.int64), "ax")]
    nodes = [helper.make_node("Unsqueeze", ["h", "ax"], ["h3"]), helper.make_node("Unsqueeze", ["c", "ax"], ["c3"]),
             helper.make_node("LSTM", ["x", "W", "R", "", "", "h3", "c3"], ["y", "yh", "yc"], hidden_size=8),
             helper.make_node("Squeeze", ["yh", "ax"], ["h_next"]), helper.make_node("Squeeze", ["yc", "ax"], ["c_next"])]
    path = save_model(tmp_path, "lstm", nodes,
                      [helper.make_tensor_value_info("x", F, [5, 1, 4]), helper.make_tensor_value_info("h", F, [1, 8]),
                       helper.make_tensor_value_info("c", F, [1, 8])],
                      [helper.make_tensor_value_info("y", F, [5, 1, 1, 8]), helper.make_tensor_value_info("h_next", F, [1, 8]),
                       helper.make_tensor_value_info("c_next", F, [1, 8])], inits)
    got = _pairs(path)
    assert got == {("h", "h_next", "rnn", None), ("c", "c_next", "rnn", None)}, got


def test_caches_by_name_kv_growing_and_no_false_pairs(tmp_path):
    # FSMN-style caches: the new cache is the last frames of Concat(old cache, input)
    x = helper.make_tensor_value_info("input", F, [1, 4, 3])
    caches = [helper.make_tensor_value_info(f"in_cache{i}", F, [1, 2, 3]) for i in range(2)]
    kv = helper.make_tensor_value_info("past_key_values.0.key", F, [1, 2, "past", 8])
    new = helper.make_tensor_value_info("new_key", F, [1, 2, "seq", 8])
    nodes, outs = [], [helper.make_tensor_value_info("output", F, [1, 4, 3])]
    for i in range(2):
        nodes += [helper.make_node("Concat", [f"in_cache{i}", "input"], [f"cat{i}"], axis=1),
                  helper.make_node("Slice", [f"cat{i}", "s", "e", "a"], [f"out_cache{i}"])]
        outs.append(helper.make_tensor_value_info(f"out_cache{i}", F, [1, 2, 3]))
    nodes += [helper.make_node("Relu", ["input"], ["output"]),
              helper.make_node("Concat", ["past_key_values.0.key", "new_key"], ["present.0.key"], axis=2)]
    outs.append(helper.make_tensor_value_info("present.0.key", F, [1, 2, "total", 8]))
    inits = [numpy_helper.from_array(np.array([-2], np.int64), n) for n in ("s",)] + \
        [numpy_helper.from_array(np.array([2**31], np.int64), "e"), numpy_helper.from_array(np.array([1], np.int64), "a")]
    path = save_model(tmp_path, "caches", nodes, [x, *caches, kv, new], outs, inits)
    got = _pairs(path)
    assert ("in_cache0", "out_cache0", "names", None) in got and ("in_cache1", "out_cache1", "names", None) in got
    assert ("past_key_values.0.key", "present.0.key", "kv", 2) in got
    assert not any(p[0] == "input" for p in got), got   # the main input/output is no state
    assert len(got) == 3, got


@pytest.mark.slow
@pytest.mark.parametrize("name, want", [
    ("fsmn_vad", {(f"in_cache{i}", f"out_cache{i}") for i in range(4)}),
    ("silero_vad", {("state", "stateN")}),
    ("silero_vad_v6", {("h", "hn"), ("c", "cn")}),
])
def test_real_streaming_models(name, want):
    got = {(p.input, p.output) for p in find_state_pairs(load_onnx(zoo_model(name)).model)}
    assert got == want, got


def _caches(tmp_path):
    x = helper.make_tensor_value_info("input", F, [1, 4, 3])
    nodes, ins, outs = [helper.make_node("Relu", ["input"], ["output"])], [x], [helper.make_tensor_value_info("output", F, [1, 4, 3])]
    for i in range(2):
        ins.append(helper.make_tensor_value_info(f"in_cache{i}", F, [1, 2, 3]))
        nodes += [helper.make_node("Concat", [f"in_cache{i}", "input"], [f"cat{i}"], axis=1),
                  helper.make_node("Slice", [f"cat{i}", "s", "e", "a"], [f"out_cache{i}"])]
        outs.append(helper.make_tensor_value_info(f"out_cache{i}", F, [1, 2, 3]))
    inits = [numpy_helper.from_array(np.array([-2], np.int64), "s"), numpy_helper.from_array(np.array([2**31], np.int64), "e"),
             numpy_helper.from_array(np.array([1], np.int64), "a")]
    return save_model(tmp_path, "caches", nodes, ins, outs, inits)


def test_stateful_entry_and_the_state_flags(tmp_path):
    """The found pairs make a sequence-batched entry whose interface leaves the state out and whose
    verify runs a sequence; --state picks pairs itself; --no-state serves it stateless."""
    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    src = _caches(tmp_path)
    run = CliRunner().invoke
    r = run(app, ["convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r"), "--name", "a", "--verify", "--json"])
    assert r.exit_code == 0, r.output
    out = json_of(r.output)
    cfg = (tmp_path / "r" / "a" / "config.pbtxt").read_text()
    assert "sequence_batching" in cfg and "oldest" in cfg and 'name: "in_cache0"' not in cfg
    assert out["verification"]["sequence"]["state"] == ["in_cache0->out_cache0", "in_cache1->out_cache1"]
    r = run(app, ["convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r"), "--name", "b",
                  "--state", "in_cache1=out_cache1", "--sequence-strategy", "DIRECT"])
    cfg = (tmp_path / "r" / "b" / "config.pbtxt").read_text()
    assert r.exit_code == 0 and 'name: "in_cache0"' in cfg and 'name: "in_cache1"' not in cfg and "direct" in cfg, r.output
    r = run(app, ["convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r"), "--name", "c", "--no-state"])
    assert r.exit_code == 0 and "sequence_batching" not in (tmp_path / "r" / "c" / "config.pbtxt").read_text()
    for bad, says in ((["--state", "in_cache0=output"], "must keep its type and shape"),
                      (["--state", "x=y"], "no input 'x'"), (["--state", "in_cache0=out_cache0", "--no-state"], "give one"),
                      (["--sequence-strategy", "newest"], "direct or oldest")):
        r = run(app, ["convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r"), "--name", "d", *bad])
        assert r.exit_code == 2 and says in r.output, (bad, r.output)


def json_of(text: str) -> dict:
    import json

    return json.loads(text)


def _decoder_step(tmp_path):
    """One decoder step: the token's key appended to the past keys (a KV cache growing on axis 1)."""
    nodes = [helper.make_node("Concat", ["past_key_values.0.key", "x"], ["present.0.key"], axis=1),
             helper.make_node("ReduceMean", ["present.0.key"], ["y"], axes=[1], keepdims=0)]
    return save_model(tmp_path, "step", nodes,
                      [helper.make_tensor_value_info("x", F, [1, 1, 8]),
                       helper.make_tensor_value_info("past_key_values.0.key", F, [1, "past", 8])],
                      [helper.make_tensor_value_info("y", F, [1, 8]),
                       helper.make_tensor_value_info("present.0.key", F, [1, "total", 8])])


def test_growing_kv_state_on_the_server_with_a_bound(tmp_path):
    from typer.testing import CliRunner

    from mcp_compiler.cli import app
    from mcp_compiler.targets.triton.emit import write_runtime
    from mcp_compiler.targets.triton.verify import load_runtime

    src = _decoder_step(tmp_path)
    assert _pairs(src) == {("past_key_values.0.key", "present.0.key", "kv", 1)}
    r = CliRunner().invoke(app, ["convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r"), "--name", "dec",
                                 "--verify", "--json"])
    assert r.exit_code == 0, r.output
    assert json_of(r.output)["verification"]["sequence"]["steps"] == 3   # 3 growing steps match onnxruntime
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = text_format.Parse((tmp_path / "r" / "dec" / "config.pbtxt").read_text(), mc.ModelConfig())
    state = json_of(cfg.parameters["mcp_state"].string_value)
    assert cfg.HasField("sequence_batching") and [i.name for i in cfg.input] == ["x"]
    assert state == [{"input": "past_key_values.0.key", "output": "present.0.key", "dtype": "float32",
                      "shape": [1, 0, 8], "grows_axis": 1, "max_length": 4096}]
    write_runtime(tmp_path / "rt")
    rt = load_runtime(tmp_path / "rt")
    t = rt.SequenceState([{"input": "past", "output": "present", "dtype": "float32", "shape": [1, 0, 8],
                           "grows_axis": 1, "max_length": 2}])

    def step(feeds, names):
        present = np.concatenate([feeds["past"], feeds["x"]], axis=1)
        return [present.mean(axis=1), present]

    x = {"x": np.ones((1, 1, 8), np.float32)}
    t.step(step, x, ["y"], 9, True, False)
    t.step(step, x, ["y"], 9, False, False)
    assert t.table[9][1]["past"].shape == (1, 2, 8)
    with pytest.raises(ValueError, match="past max_state_length 2"):
        t.step(step, x, ["y"], 9, False, False)
    assert 9 not in t.table


def test_an_openvino_entrys_sequence_check_runs_on_openvino(tmp_path, monkeypatch):
    """Issue 60: a stateful entry's sequence check ran on onnxruntime even for an OpenVINO entry (the
    single requests ran on OpenVINO, the steps through the state table did not)."""
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    engines = []
    import mcp_compiler.targets.triton.verify as V

    real = V._runtime_model

    def spy(rt, vdir, **kw):
        engines.append(kw.get("engine", "onnxruntime"))
        return real(rt, vdir, **kw)
    monkeypatch.setattr(V, "_runtime_model", spy)
    src = _caches(tmp_path)
    r = CliRunner().invoke(app, ["convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r"), "--name", "a",
                                 "--runtime", "openvino", "--precision", "f32", "--verify", "--json"])
    assert r.exit_code == 0, r.output
    v = json_of(r.output)["verification"]
    assert v["execution"] == "openvino/f32" and v["sequence"]["execution"] == "openvino/f32" and v["ok"], v
    assert engines and set(engines) == {"openvino"}, engines


def _unrolled(tmp_path, gates: bool = True):
    """An unrolled LSTM-like step: main x [1, 16] -> y [1, 16]; its state `mem` [1, 2, 8, 2] in and
    the next state `upd` out, computed from it through Sigmoid and Tanh gates (or, without
    gates, a plain Add): names that pair up with nothing."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 2, 8, 2], np.int64), "shape")
    flat = numpy_helper.from_array(np.array([1, 32], np.int64), "flat")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Reshape", ["xw", "shape"], ["xr"]),
             helper.make_node("Add", ["xr", "mem"], ["pre"])]
    if gates:
        nodes += [helper.make_node("Sigmoid", ["pre"], ["f"]), helper.make_node("Tanh", ["pre"], ["g"]),
                  helper.make_node("Mul", ["f", "mem"], ["fm"]), helper.make_node("Add", ["fm", "g"], ["upd"])]
    else:
        nodes += [helper.make_node("Add", ["pre", "mem"], ["upd"])]
    nodes += [helper.make_node("Reshape", ["upd", "flat"], ["u32"]),
              helper.make_node("Slice", ["u32", "s0", "s16", "s1"], ["y"])]
    inits = [w, shape, flat] + [numpy_helper.from_array(np.array([v], np.int64), n)
                                for n, v in (("s0", 0), ("s16", 16), ("s1", 1))]
    return save_model(tmp_path, "unrolled" if gates else "plain", nodes,
                      [helper.make_tensor_value_info("x", F, [1, 16]), helper.make_tensor_value_info("mem", F, [1, 2, 8, 2])],
                      [helper.make_tensor_value_info("y", F, [1, 16]), helper.make_tensor_value_info("upd", F, [1, 2, 8, 2])],
                      inits)


def test_a_state_pair_by_shape_through_gates_is_proposed_and_used_only_when_given(tmp_path):
    """issue 59: an unrolled-LSTM denoiser with its state in [1, 2, 128, 2] and out under another
    name was served stateless with no hint. Proposed by inspect and the convert warning with the
    flag to pass; used only when given; not proposed without gates between them."""
    import json

    from typer.testing import CliRunner

    from mcp_compiler.cli import app
    from mcp_compiler.state import proposed_pairs

    src = _unrolled(tmp_path)
    model = load_onnx(src).model
    assert find_state_pairs(model) == []
    [p] = proposed_pairs(model)
    assert (p.input, p.output, p.kind) == ("mem", "upd", "shape") and "Sigmoid and Tanh" in p.why
    run = CliRunner().invoke
    r = run(app, ["inspect", str(src), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["state_proposed"][0]["output"] == "upd", r.output
    r = run(app, ["inspect", str(src)])
    assert "--state mem=upd serves it so" in r.output, r.output
    r = run(app, ["convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r"), "--name", "a"])
    assert r.exit_code == 0 and "--state mem=upd serves them so" in r.output, r.output
    assert "sequence_batching" not in (tmp_path / "r" / "a" / "config.pbtxt").read_text()   # proposed, not used
    r = run(app, ["convert", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r"), "--name", "b",
                  "--state", "mem=upd", "--verify"])
    assert r.exit_code == 0 and "look like a state pair" not in r.output, r.output
    assert "sequence_batching" in (tmp_path / "r" / "b" / "config.pbtxt").read_text()
    assert proposed_pairs(load_onnx(_unrolled(tmp_path, gates=False)).model) == []
