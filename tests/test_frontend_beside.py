"""onnx's checker and shape inference in a process beside the import (mcp_compiler.forked): the
model, the warnings and the errors are those of running them one after the other."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import numpy as np
import onnx
import pytest
from _helpers import save_model, zoo_params
from onnx import TensorProto, helper, numpy_helper
from test_frontend_light import _model

from mcp_compiler.errors import InvalidModelError
from mcp_compiler.forked import Beside
from mcp_compiler.frontend import load_onnx
from mcp_compiler.frontend import onnx as frontend
from mcp_compiler.ir.printer import print_model

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _same_both_ways(path: Path) -> None:
    serial, beside = load_onnx(path, beside=False), load_onnx(path, beside=True)
    assert print_model(beside.model) == print_model(serial.model)
    assert beside.warnings == serial.warnings


@pytest.mark.parametrize("name", ["light_resnet50", "light_bvlc_alexnet", "light_shufflenet", "light_squeezenet"])
def test_models_load_the_same_beside(name):
    _same_both_ways(LIGHT / f"{name}.onnx")


@pytest.mark.parametrize("path", zoo_params())
def test_real_models_load_the_same_beside(path):
    _same_both_ways(path)


def test_a_subgraph_and_big_constants_load_the_same_beside(tmp_path):
    """The If (its branches' shapes come from the inferred model): imported after inference."""
    _same_both_ways(_model(tmp_path / "m.onnx"))


def test_big_constants_and_initializers_load_the_same_beside(tmp_path):
    """The light copy's stand-ins (a 128 KiB Constant, a 128 KiB initializer) with no subgraph:
    the nodes come from the file while the light copy is inferred."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4096)).astype(np.float32)
    big = rng.standard_normal((32768,)).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
             helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Relu", ["mm"], ["y"]),
             helper.make_node("Neg", ["big"], ["z"])]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4096]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [32768])],
                          initializer=[numpy_helper.from_array(big, "big")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert sorted(frontend._without_big_tensors(onnx.load(path))[1]) == ["big", "w"]
    _same_both_ways(path)
    mm = load_onnx(path, beside=True).model.graph.nodes[1].outputs[0]
    assert mm.type is not None and mm.type.shape == ("N", 4096)   # inferred through the stand-in


def test_a_chain_without_declared_types_loads_the_same_beside(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    c = numpy_helper.from_array(np.full(8, 2.0, np.float32), "c")
    nodes = [helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])]
    path = save_model(tmp_path, "m", nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, "N"])], [c])
    _same_both_ways(path)
    r = load_onnx(path, beside=True).model.graph.nodes[1].outputs[0]
    assert r.type is not None and r.type.shape == ("N", 8)   # inferred beside, taken after


def test_the_checkers_refusal_comes_first(tmp_path):
    """A node reading a value nothing defines: the importer refuses it too, with its own words;
    the checker's refusal is the one reported, as when it runs first."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Relu", ["nowhere"], ["y"])]
    path = save_model(tmp_path, "m", nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    errors = []
    for beside in (False, True):
        with pytest.raises(InvalidModelError, match="onnx.checker rejected the model") as e:
            load_onnx(path, beside=beside)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    with pytest.raises(InvalidModelError, match="uses undefined value 'nowhere'"):
        load_onnx(path, check=False, infer_shapes=False)   # what the importer says without it


def test_a_failed_inference_is_the_same_warning_beside(tmp_path, monkeypatch):
    """Shape inference fails (made to, here: the fork's child has the same patched function); the
    model still loads, with the types it declares."""
    def fails(*a, **k):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] made to fail\nsecond line")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fails)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    path = save_model(tmp_path, "m", [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
                      [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    serial = load_onnx(path, beside=False)
    # the whole message on one line (never cut where the checker's text breaks a line)
    assert serial.warnings == ["ONNX shape inference failed, shapes kept as given: [ShapeInferenceError] made to fail "
                               "second line"]
    assert serial.model.graph.nodes[0].outputs[0].type is None
    _same_both_ways(path)


def test_big_graphs_are_checked_beside_by_default(tmp_path, monkeypatch):
    forked = []

    class Spy(Beside):
        def __init__(self, fn, *, fork):
            forked.append(fork)
            super().__init__(fn, fork=fork)

    monkeypatch.setattr(frontend, "Beside", Spy)
    monkeypatch.setattr(frontend, "can_fork", lambda: True)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"r{i - 1}"], [f"r{i}"]) for i in range(3)]
    path = save_model(tmp_path, "m", nodes, [x], [helper.make_tensor_value_info("r2", TensorProto.FLOAT, [2])])
    load_onnx(path)
    monkeypatch.setattr(frontend, "_BESIDE_MIN_NODES", 3)
    load_onnx(path)
    monkeypatch.setattr(frontend, "can_fork", lambda: False)   # another thread runs: never forked
    load_onnx(path)
    assert forked == [False, True, False]


# -- the helper itself ------------------------------------------------------------------------------
def test_beside_gives_back_the_value_and_the_error():
    assert Beside(lambda: {"a": [1, 2]}, fork=True).result() == {"a": [1, 2]}

    def fails():
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as e:
        Beside(fails, fork=True).result()
    assert e.value.errno == errno.ENOSPC
    inline = Beside(fails, fork=False)
    assert not inline.forked
    with pytest.raises(OSError):
        inline.result()


def test_beside_reports_a_child_that_died_and_an_error_that_does_not_pickle():
    with pytest.raises(RuntimeError, match="ended without a result \\(killed by signal 9\\)"):
        Beside(lambda: os.kill(os.getpid(), signal.SIGKILL), fork=True).result()

    class Odd(Exception):
        def __reduce__(self):
            raise TypeError("not picklable")

    def fails():
        raise Odd("the reason")

    with pytest.raises(RuntimeError, match="Odd: the reason"):
        Beside(fails, fork=True).result()


def test_an_interrupt_during_the_import_waits_for_the_child(tmp_path, monkeypatch):
    """Ctrl-C while the nodes are imported: the child is reaped before the interrupt goes on (no
    process left behind)."""
    def interrupted(self, p):
        raise KeyboardInterrupt

    monkeypatch.setattr(frontend._Importer, "main_body", interrupted)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    path = save_model(tmp_path, "m", [helper.make_node("Relu", ["x"], ["y"])], [x],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    forked = []
    real = frontend.Beside

    def spy(fn, *, fork):
        forked.append(real(fn, fork=fork))
        return forked[-1]

    monkeypatch.setattr(frontend, "Beside", spy)
    with pytest.raises(KeyboardInterrupt):
        load_onnx(path, beside=True)
    assert forked[0].forked and forked[0].pid is None   # waited for
