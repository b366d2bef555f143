"""Accuracy judged where damage hides (issue 58, item 4): every float output per slice as well
as whole, integer outputs by exact match, and a budget that judged nothing is no pass."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from mcp_compiler.accuracy import exact_match, slice_bound, worst_slice
from mcp_compiler.cli import app
from mcp_compiler.errors import AccuracyError, VerificationError
from mcp_compiler.reference import verify_onnx

runner = CliRunner()
N = 400   # anchors


def _detector(path, damaged: bool = False) -> None:
    """x [1, 8, N] -> one output [1, 6, N]: 4 box rows of 0-320 px beside 2 sigmoid score rows
    (YOLOv8's output0). `damaged`: the scores rounded to 0 or one step of 1.24 (320/255, one
    per-tensor int8 scale over the boxes and scores together), as onnxruntime's int8 gave."""
    rng = np.random.default_rng(0)
    wb = rng.standard_normal((4, 8)).astype(np.float32)
    ws = rng.standard_normal((2, 8)).astype(np.float32)
    inits = [numpy_helper.from_array(wb, "wb"), numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(np.array(160.0, np.float32), "half")]
    nodes = [helper.make_node("MatMul", ["wb", "x0"], ["b0"]), helper.make_node("Tanh", ["b0"], ["b1"]),
             helper.make_node("Mul", ["b1", "half"], ["b2"]), helper.make_node("Add", ["b2", "half"], ["boxes"]),
             helper.make_node("MatMul", ["ws", "x0"], ["s0"]), helper.make_node("Sigmoid", ["s0"], ["scores"]),
             helper.make_node("Squeeze", ["x", "ax0"], ["x0"])]
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "ax0"))
    last = "scores"
    if damaged:
        inits.append(numpy_helper.from_array(np.array(1.24, np.float32), "step"))
        nodes += [helper.make_node("Div", ["scores", "step"], ["q0"]), helper.make_node("Round", ["q0"], ["q1"]),
                  helper.make_node("Mul", ["q1", "step"], ["qs"])]
        last = "qs"
    nodes += [helper.make_node("Concat", ["boxes", last], ["y0"], axis=0),
              helper.make_node("Unsqueeze", ["y0", "ax0"], ["y"])]
    g = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, N])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def _samples(tmp_path, name: str, arrays: list[dict]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    for i, a in enumerate(arrays):
        np.savez(folder / f"{i}.npz", **a)
    return str(folder)


def test_a_destroyed_score_slice_fails_while_the_whole_output_reads_cosine_0_999(tmp_path):
    _detector(tmp_path / "orig.onnx")
    _detector(tmp_path / "broken.onnx", damaged=True)
    rng = np.random.default_rng(1)
    inputs = _samples(tmp_path, "in", [{"x": rng.standard_normal((1, 8, N)).astype(np.float32)} for _ in range(4)])
    # what a whole-tensor judgement sees: the boxes dominate the cosine
    rep = verify_onnx(tmp_path / "orig.onnx", tmp_path / "orig.onnx", inputs=inputs, budget={"cos": 0.99})
    assert rep.ok and rep.outputs[0].slice_rel_error == 0.0
    with pytest.raises(VerificationError) as e:
        verify_onnx(tmp_path / "orig.onnx", tmp_path / "broken.onnx", inputs=inputs, budget={"cos": 0.99}).raise_if_failed()
    msg = str(e.value)
    assert "of its slice at axis 1 index" in msg and "cosine" in msg, msg
    # the whole output's cosine is above 0.999 all the same: the slice is what caught it
    import onnxruntime as ort

    a, b = (ort.InferenceSession(str(tmp_path / f)) for f in ("orig.onnx", "broken.onnx"))
    xs = [dict(np.load(p)) for p in sorted((tmp_path / "in").glob("*.npz"))]
    want, got = [a.run(None, x)[0] for x in xs], [b.run(None, x)[0] for x in xs]
    whole = min(float(w.ravel() @ g.ravel() / np.linalg.norm(w) / np.linalg.norm(g)) for w, g in zip(want, got))
    assert whole >= 0.999, whole
    rel, where = worst_slice(want, got)
    assert where.startswith("axis 1 index ") and int(where.split()[-1]) >= 4   # a score row
    assert rel > slice_bound({"cos": 0.99})


def test_slices_of_a_uniformly_good_output_pass():
    rng = np.random.default_rng(0)
    want = [rng.standard_normal((1, 6, N)) * np.array([300, 300, 300, 300, 1, 1])[None, :, None] for _ in range(3)]
    got = [w + 1e-3 * rng.standard_normal(w.shape) * np.abs(w) for w in want]
    rel, _ = worst_slice(want, got)
    assert rel < 2e-3
    # a channel a ReLU keeps at zero, slightly alive afterwards, is judged against a typical channel
    want = [np.abs(rng.standard_normal((4, 64))) for _ in range(3)]
    for w in want:
        w[:, 7] = 0.0
    got = [w + 1e-6 for w in want]
    assert worst_slice(want, got)[0] < 0.01
    # nothing to slice: a vector, or 1,000 classes and nothing else
    assert worst_slice([np.ones(5)], [np.ones(5)]) is None
    assert worst_slice([np.ones((1, 1000))], [np.ones((1, 1000))]) is None
    # a classifier's two probabilities are not slices of their own (each would be one number)
    assert worst_slice([np.array([[0.999, 0.001]])], [np.array([[0.998, 0.002]])]) is None
    assert slice_bound({"cos": 0.99}) == pytest.approx(3 * np.sqrt(0.02)) and slice_bound({"slice": 2.0}) == 2.0


def _argmax_model(path, shift: float = 0.0) -> None:
    """x [n, 16] -> MatMul -> ArgMax: ids only. `shift` moves one logit, changing some ids."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    bias = np.zeros(8, np.float32)
    bias[3] = shift
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["l0"]), helper.make_node("Add", ["l0", "b"], ["l"]),
         helper.make_node("ArgMax", ["l"], ["ids"], axis=1, keepdims=0)],
        "ids", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_integer_outputs_are_judged_by_exact_match(tmp_path):
    _argmax_model(tmp_path / "orig.onnx")
    _argmax_model(tmp_path / "moved.onnx", shift=0.6)
    rng = np.random.default_rng(2)
    inputs = _samples(tmp_path, "in", [{"x": rng.standard_normal((64, 16)).astype(np.float32)} for _ in range(4)])
    with pytest.raises(VerificationError) as e:
        verify_onnx(tmp_path / "orig.onnx", tmp_path / "moved.onnx", inputs=inputs, budget={"cos": 0.9}).raise_if_failed()
    assert "of its elements equal the original's < match=0.99" in str(e.value), str(e.value)
    rep = verify_onnx(tmp_path / "orig.onnx", tmp_path / "moved.onnx", inputs=inputs, budget={"cos": 0.9, "match": 0.5})
    assert rep.ok and 0.5 <= rep.outputs[0].exact_match < 0.99
    assert exact_match([np.array([1, 2, 3, 4])], [np.array([1, 2, 3, 5])]) == 0.75


def test_an_int4_entry_of_an_ids_only_model_reports_and_judges_the_ids(tmp_path):
    src = tmp_path / "m.onnx"
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["l"]), helper.make_node("ArgMax", ["l"], ["ids"], axis=1, keepdims=0)],
        "ids", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 256])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    r = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "q.onnx"), "--quantize", "int4", "--json"])
    assert r.exit_code == 0, r.output
    acc = json.loads(r.output)["quantization"]["accuracy"]
    (o,) = acc["outputs"]
    assert o["name"] == "ids" and o["exact_match"] is not None and o["exact_match"] < 1.0
    r = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "q2.onnx"), "--quantize", "int4",
                            "--accuracy-budget", "cos=0.98,match=1", "--no-auto-exclude"])
    assert r.exit_code == 1 and "match=1" in r.output and not (tmp_path / "q2.onnx").exists(), r.output


def test_a_budget_that_judged_nothing_is_an_error(tmp_path):
    from mcp_compiler.accuracy import measure
    from mcp_compiler.frontend import load_onnx

    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["l"]), helper.make_node("Cast", ["l"], ["s"], to=TensorProto.STRING)],
        "strings", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2, 8])],
        [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "s.onnx")
    model = load_onnx(tmp_path / "s.onnx").model
    with pytest.raises(AccuracyError, match="a budget that judged nothing is no pass"):
        measure(tmp_path / "s.onnx", model, [{"x": rng.standard_normal((2, 8)).astype(np.float32)}], "one sample")
