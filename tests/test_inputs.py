"""mcp_compiler.inputs: inputs a model accepts, rule by rule on small graphs, each checked by
running the original in onnxruntime; NaN outputs, outputs not exercised, --inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import ort_run, save_model
from onnx import TensorProto, helper, numpy_helper

from mcp_compiler.errors import UsageError
from mcp_compiler.frontend import load_onnx
from mcp_compiler.inputs import load_inputs, make, plan, probe

F, I64 = TensorProto.FLOAT, TensorProto.INT64
CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def _model(tmp_path: Path, nodes, inputs, outputs, inits=(), opset=17, name="m") -> Path:
    return save_model(tmp_path, name, nodes, inputs, outputs, inits, opset)


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _plan(path: Path, dims=None, run: bool = True):
    model = load_onnx(path, check=False, infer_shapes=False).model
    p = plan(model, dims)
    if run:
        probe(model, p, lambda feeds: ort_run(path, feeds))
    return model, p


def _sample(path: Path, dims=None):
    model, p = _plan(path, dims)
    feeds = make(model, p, np.random.default_rng(0))
    outs = ort_run(path, feeds)   # the original accepts them: this is the whole point
    return p, feeds, outs


def test_one_size_per_symbol_across_inputs(tmp_path):
    # a recurrent state [layers, batch, hidden] beside [batch, T]: batch at axis 1 and axis 0
    w = numpy_helper.from_array(np.ones((1, 24, 8), np.float32) * 0.1, "w")
    r = numpy_helper.from_array(np.ones((1, 24, 8), np.float32) * 0.1, "r")
    src = _model(tmp_path, [helper.make_node("GRU", ["x", "w", "r", "", "", "h0"], ["y", "yh"], hidden_size=8)],
                 [_vi("x", ["T", "batch", 8]), _vi("h0", [1, "batch", 8])], [_vi("yh", [1, "batch", 8])], [w, r])
    p, feeds, _ = _sample(src)
    assert feeds["x"].shape[1] == feeds["h0"].shape[1] == p.sizes["batch"]


def test_a_symbol_tied_to_a_constant_takes_it(tmp_path):
    # Concat along axis 1 with a [3, 4] constant: the op needs batch == 3
    c = numpy_helper.from_array(np.ones((3, 4), np.float32), "c")
    src = _model(tmp_path, [helper.make_node("Concat", ["x", "c"], ["y"], axis=1)],
                 [_vi("x", ["batch", 4])], [_vi("y", ["batch", 8])], [c])
    p, feeds, _ = _sample(src)
    assert p.sizes == {"batch": 3} and any("== 3" in c for c in p.constraints["batch"])


def test_conflicting_constants_are_an_error_naming_them(tmp_path):
    c3 = numpy_helper.from_array(np.ones((3, 4), np.float32), "c3")
    c4 = numpy_helper.from_array(np.ones((4, 4), np.float32), "c4")
    src = _model(tmp_path, [helper.make_node("Concat", ["x", "c3"], ["a"], axis=1, name="cat3"),
                            helper.make_node("Concat", ["x", "c4"], ["b"], axis=1, name="cat4")],
                 [_vi("x", ["batch", 4])], [_vi("a", ["batch", 8]), _vi("b", ["batch", 8])], [c3, c4])
    with pytest.raises(UsageError, match=r"'batch' must equal both 3 and 4 .*cat3.*cat4"):
        _plan(src, run=False)


def test_sizes_solve_the_ops_equalities(tmp_path):
    # pool by 3, upsample by 3, concat with the input: H and W must be multiples of 3 (32 is not)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[3, 3]),
             helper.make_node("Resize", ["p", "", "scales"], ["u"], mode="nearest"),
             helper.make_node("Concat", ["x", "u"], ["y"], axis=1)]
    scales = numpy_helper.from_array(np.array([1, 1, 3, 3], np.float32), "scales")
    src = _model(tmp_path, nodes, [_vi("x", ["N", 2, "H", "W"])], [_vi("y", ["N", 4, "H", "W"])], [scales])
    p, feeds, _ = _sample(src)
    assert p.sizes["H"] % 3 == 0 and p.sizes["W"] % 3 == 0 and p.sizes["H"] >= 32


def test_reflect_pad_and_window_minimums(tmp_path):
    # reflect pad of 40 needs T > 40; a window of 50 without padding needs T + 80 >= 50 (already)
    pads = numpy_helper.from_array(np.array([0, 40, 0, 40], np.int64), "pads")
    w = numpy_helper.from_array(np.ones((1, 1, 100), np.float32), "w")
    nodes = [helper.make_node("Pad", ["x", "pads"], ["xp"], mode="reflect"),
             helper.make_node("Unsqueeze", ["xp", "one"], ["xu"]),
             helper.make_node("Conv", ["xu", "w"], ["y"])]
    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    src = _model(tmp_path, nodes, [_vi("x", ["N", "T"])], [_vi("y", ["N", 1, "L"])], [pads, w, one])
    p, feeds, _ = _sample(src)
    assert p.sizes["T"] > 40 and p.sizes["T"] + 80 >= 100
    assert any("reflect pad" in c for c in p.constraints["T"])


def test_lengths_grow_until_the_original_runs(tmp_path):
    # the same reflect pad inside an If branch: inference cannot see it, the probe finds a length
    pads = numpy_helper.from_array(np.array([0, 100, 0, 100], np.int64), "pads")
    then_g = helper.make_graph([helper.make_node("Pad", ["x", "pads"], ["t"], mode="reflect")], "then", [],
                               [_vi("t", None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e", None)])
    src = _model(tmp_path, [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                            helper.make_node("Size", ["x"], ["n"]),
                            helper.make_node("Greater", ["n", "zero"], ["c"]),
                            helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                 [_vi("x", ["N", "T"])], [_vi("y", None)], [pads, numpy_helper.from_array(np.array(0, np.int64), "zero")])
    p, feeds, _ = _sample(src)
    assert p.sizes["T"] > 100 and len(p.tried) > 1 and "failed" in p.notes[0]


def test_indices_stay_inside_what_they_index(tmp_path):
    # token_type_ids index a 2-row table; input_ids a 50-row one (through a Cast)
    words = numpy_helper.from_array(np.ones((50, 4), np.float32), "words")
    types = numpy_helper.from_array(np.ones((2, 4), np.float32), "types")
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
             helper.make_node("Gather", ["words", "ids32"], ["e1"]),
             helper.make_node("Gather", ["types", "token_type_ids"], ["e2"]),
             helper.make_node("Add", ["e1", "e2"], ["y"])]
    src = _model(tmp_path, nodes, [_vi("input_ids", ["B", "S"], I64), _vi("token_type_ids", ["B", "S"], I64)],
                 [_vi("y", ["B", "S", 4])], [words, types])
    p, feeds, _ = _sample(src)
    assert feeds["token_type_ids"].max() <= 1 and feeds["input_ids"].max() < 50
    assert feeds["input_ids"].max() >= 3   # the whole table, not just [0, 3)
    assert "below 2" in p.domains["token_type_ids"] and "below 50" in p.domains["input_ids"]


def test_scalars_compared_with_constants_and_masks(tmp_path):
    nan = numpy_helper.from_array(np.array(np.nan, np.float32), "nan")
    k = numpy_helper.from_array(np.array(16000, np.int64), "k")
    nodes = [helper.make_node("Equal", ["sr", "k"], ["is16k"]),
             helper.make_node("Where", ["is16k", "x", "nan"], ["a"]),
             helper.make_node("Cast", ["keep"], ["keepb"], to=TensorProto.BOOL),
             helper.make_node("Where", ["keepb", "a", "nan"], ["y"])]
    src = _model(tmp_path, nodes, [_vi("x", ["N", 4]), _vi("sr", [], I64), _vi("keep", ["N", 4], I64)],
                 [_vi("y", ["N", 4])], [nan, k])
    p, feeds, outs = _sample(src)
    assert int(feeds["sr"]) == 16000 and set(np.unique(feeds["keep"])) <= {0, 1}
    assert p.domains["x"] == "N(0, 1)"   # Where's value operand is not a condition


def test_unknown_dims_symbol_lists_the_model_symbols(tmp_path):
    src = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", "T"])],
                 [_vi("y", ["batch", "T"])])
    with pytest.raises(UsageError, match=r"no symbol 'Tee'; its input symbols: batch, T"):
        _plan(src, {"Tee": 4}, run=False)


# -- through the CLI ------------------------------------------------------------------------------

def _cli(*args: str):
    return subprocess.run([*CLI, *args], capture_output=True, text=True)


def test_all_nan_original_fails_and_positions_must_agree(tmp_path):
    # Log(-|x| - 1) is NaN everywhere: nothing can be compared
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["n"]),
             helper.make_node("Sub", ["n", "one"], ["m"]), helper.make_node("Log", ["m"], ["y"])]
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    src = _model(tmp_path, nodes, [_vi("x", ["N", 4])], [_vi("y", ["N", 4])], [one], name="nan")
    r = _cli("convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--verify")
    assert r.returncode == 1 and "only NaN/Inf for output 'y'" in r.stderr and "--inputs" in r.stderr, r.stderr
    assert not (tmp_path / "repo").exists()
    # Sqrt: NaN where x < 0, at the same places in both: compared on the rest, ok
    src = _model(tmp_path, [helper.make_node("Sqrt", ["x"], ["y"])], [_vi("x", ["N", 4])], [_vi("y", ["N", 4])],
                 name="sqrt")
    r = _cli("convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--verify")
    assert r.returncode == 0, r.stderr


def test_outputs_not_exercised_are_flagged(tmp_path):
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    src = _model(tmp_path, [helper.make_node("Mul", ["x", "zero"], ["y"]), helper.make_node("Relu", ["x"], ["z"])],
                 [_vi("x", ["N", 4])], [_vi("y", ["N", 4]), _vi("z", ["N", 4])], [zero], name="zeros")
    r = _cli("convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--verify")
    assert r.returncode == 0, r.stderr
    assert "y: max abs 0" in r.stdout and "NOT EXERCISED" in r.stdout.split("y: max abs")[1].splitlines()[0]
    assert "NOT EXERCISED" not in r.stdout.split("z: max abs")[1].splitlines()[0]
    r = _cli("verify", "-i", str(src), "-r", str(tmp_path / "repo" / "zeros"), "--json")
    out = {o["name"]: o for o in json.loads(r.stdout)["outputs"]}
    assert out["y"]["exercised"] is False and out["z"]["exercised"] is True


def test_user_inputs(tmp_path):
    src = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 4])], [_vi("y", ["N", 4])],
                 name="relu")
    repo = tmp_path / "repo"
    assert _cli("convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(repo)).returncode == 0
    good = tmp_path / "good.npz"
    np.savez(good, x=np.arange(12, dtype=np.float32).reshape(3, 4) - 6)
    r = _cli("verify", "-i", str(src), "-r", str(repo / "relu"), "--inputs", str(good), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["inputs"] == {"from": str(good), "samples": 1}, r.stderr
    folder = tmp_path / "samples"
    folder.mkdir()
    for i in range(3):
        np.savez(folder / f"{i}.npz", x=np.full((2, 4), i, np.float32))
    r = _cli("convert", "-i", str(src), "-t", "triton-v1.12", "-o", str(tmp_path / "r2"), "--verify",
             "--inputs", str(folder), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["verification"]["samples"] == 3, r.stderr
    bad = {"missing": {"z": np.zeros((2, 4), np.float32)},
           "extra": {"x": np.zeros((2, 4), np.float32), "z": np.zeros(1)},
           "dtype": {"x": np.zeros((2, 4), np.float64)},
           "rank": {"x": np.zeros((2, 4, 1), np.float32)},
           "static": {"x": np.zeros((2, 5), np.float32)}}
    expect = {"missing": "no array 'x'", "extra": "array 'z' is not an input", "dtype": "is float64",
              "rank": "has rank 3", "static": "has 5 at axis 1"}
    for name, arrays in bad.items():
        f = tmp_path / f"{name}.npz"
        np.savez(f, **arrays)
        r = _cli("verify", "-i", str(src), "-r", str(repo / "relu"), "--inputs", str(f))
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and expect[name] in lines[0], (name, r.stderr)
    model = load_onnx(src).model
    assert len(load_inputs(folder, model)) == 3


def test_rank0_inputs_are_0d_arrays_of_every_dtype():
    """Issue 30 #1: a rank-0 input of any dtype is drawn as a 0-d ndarray (not a numpy scalar,
    which onnxruntime's run and tritonclient refuse), by every way of drawing."""
    from mcp_compiler.inputs import draw
    from mcp_compiler.ir import DataType

    rng = np.random.default_rng(0)
    kinds = [DataType.FLOAT, DataType.DOUBLE, DataType.FLOAT16, DataType.BFLOAT16, DataType.INT8, DataType.UINT8,
             DataType.INT16, DataType.INT32, DataType.INT64, DataType.UINT32, DataType.UINT64, DataType.BOOL]
    for dt in kinds:
        ways = [("normal",), ("choice", (0, 1)), ("range", 0, 3)] if dt != DataType.BOOL else [("normal",)]
        for how in ways:
            for floats in ("normal", "uniform", "wide"):
                if how[0] == "normal" and not (dt == DataType.BOOL or np.issubdtype(dt.numpy_dtype, np.floating)):
                    continue
                a = draw(dt.numpy_dtype, [], how, rng, "x", floats)
                assert isinstance(a, np.ndarray) and a.shape == () and a.dtype == dt.numpy_dtype, (dt, how, type(a))


F = TensorProto.FLOAT


def _save(tmp_path, name, nodes, inputs, outputs, inits=()):
    import onnx

    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", 17)])
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, p)
    return p


def test_recurrent_input_size_comes_from_the_weights(tmp_path):
    """Issue 30 #2: [d0, d1] into a bidirectional GRU: d1 must be W's last dim (12), which only the
    weights say; verify without --dims passes."""
    rng = np.random.default_rng(0)
    hidden, size = 8, 12
    inits = [numpy_helper.from_array(rng.standard_normal((2, 3 * hidden, size)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((2, 3 * hidden, hidden)).astype(np.float32), "R"),
             numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["x3"]),
             helper.make_node("GRU", ["x3", "W", "R"], ["y", "yh"], hidden_size=hidden, direction="bidirectional")]
    path = _save(tmp_path, "bigru", nodes, [helper.make_tensor_value_info("x", F, ["input_dim_0", "input_dim_1"])],
                 [helper.make_tensor_value_info("yh", F, [2, 1, hidden])], inits)
    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.inputs import plan

    p = plan(load_onnx(path).model)
    assert p.sizes["input_dim_1"] == size, p.sizes
    repo = tmp_path / "repo"
    r = _cli("convert", str(path), "-t", "triton-v1.12", "-o", str(repo), "--name", "g", "--verify")
    assert r.returncode == 0, r.stderr


def test_index_inputs_stay_below_a_symbolic_dim(tmp_path):
    """Issue 30 #3: indices into a [num_nodes, 4] input are drawn below the size chosen for
    num_nodes, whatever it is (was: [0, 3) into 2 rows)."""
    nodes = [helper.make_node("Gather", ["x", "edges"], ["g"], axis=0), helper.make_node("Relu", ["g"], ["y"])]
    path = _save(tmp_path, "gnn", nodes, [helper.make_tensor_value_info("x", F, ["num_nodes", 4]),
                                          helper.make_tensor_value_info("edges", TensorProto.INT64, ["num_edges"])],
                 [helper.make_tensor_value_info("y", F, ["num_edges", 4])])
    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.inputs import make, plan

    model = load_onnx(path).model
    p = plan(model)
    assert "indices below num_nodes" in p.domains["edges"], p.domains
    for n in (1, 2, 5):
        feeds = make(model, p, np.random.default_rng(n), sizes={**p.sizes, "num_nodes": n, "num_edges": 50})
        assert feeds["edges"].max() < n
    r = _cli("convert", str(path), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--name", "g", "--verify")
    assert r.returncode == 0, r.stderr


def test_stochastic_model_verified_with_the_noise_pinned(tmp_path):
    """Issue 30 #4: RandomNormalLike in the model: verify and the fp16 accuracy report seed the random
    nodes alike in both models for the check (was: cosine 0.7, 'differs'), say so, and the served
    model keeps its randomness (no seed in the entry)."""
    nodes = [helper.make_node("RandomNormalLike", ["x"], ["n"], scale=1.0), helper.make_node("Add", ["x", "n"], ["y"]),
             helper.make_node("MatMul", ["y", "w"], ["z"])]
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "w")
    path = _save(tmp_path, "rand", nodes, [helper.make_tensor_value_info("x", F, ["N", 8])],
                 [helper.make_tensor_value_info("z", F, ["N", 8])], [w])
    r = _cli("convert", str(path), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"), "--verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["verification"]["pinned_random"] == 1 and out["verification"]["outputs"][0]["max_abs"] == 0
    from mcp_compiler.mcpir import read_mcpir

    served = read_mcpir(tmp_path / "repo" / "rand" / "1" / "model.mcpir")
    assert not any("seed" in n.attributes for n in served.graph.nodes if n.op_type == "RandomNormalLike")
    r = _cli("convert", str(path), "-t", "triton-v1.12", "-o", str(tmp_path / "q"), "--quantize", "fp16",
             "--quantize-min-elements", "16", "--verify", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    acc = json.loads(r.stdout)["quantization"]["accuracy"]
    assert acc["pinned_random"] == 1 and acc["outputs"][0]["cosine"] > 0.999, acc
    served = read_mcpir(tmp_path / "q" / "rand" / "1" / "model.mcpir")
    assert not any("seed" in n.attributes for n in served.graph.nodes if n.op_type == "RandomNormalLike")
