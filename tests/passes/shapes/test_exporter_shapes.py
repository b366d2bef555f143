"""Shape contracts on what exporters write: PyTorch's computed Pad pads keep the batch symbol,
and tf2onnx's "to the end" Slice ends (1e9, INT_MAX) leave no min(1000000000, d) behind."""

from __future__ import annotations

import numpy as np
from _helpers import save_model
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler import CompileOptions, compile_model
from mcp_compiler.mcpir import read_mcpir


def _i(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def test_torch_pads_and_huge_slice_ends_keep_the_contract(tmp_path):
    # pads as torch.onnx writes F.pad's: Concat(pads, zeros) -> Reshape [-1, 2] -> reversed -> Transpose -> flat
    nodes = [helper.make_node("Size", ["p4"], ["n"]), helper.make_node("Sub", ["eight", "n"], ["rest"]),
             helper.make_node("Reshape", ["rest", "one"], ["rest1"]),
             helper.make_node("ConstantOfShape", ["rest1"], ["zeros"], value=numpy_helper.from_array(np.array([0], np.int64))),
             helper.make_node("Concat", ["p4", "zeros"], ["p8"], axis=0),
             helper.make_node("Reshape", ["p8", "m12"], ["p42"]),
             helper.make_node("Slice", ["p42", "sm1", "sbig", "s0", "sm1"], ["rev"]),
             helper.make_node("Transpose", ["rev"], ["tr"], perm=[1, 0]),
             helper.make_node("Reshape", ["tr", "m1"], ["pads"]),
             helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant"),
             helper.make_node("Slice", ["y", "z0", "end", "ax2"], ["ys"])]
    for end in (1_000_000_000, 2**31 - 1):
        p = save_model(tmp_path, f"pad{end}", nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3, "H", "W"])],
                       [helper.make_tensor_value_info("ys", TP.FLOAT, ["N", 3, "Ho", "Wo"])],
                       [_i("p4", [1, 1, 2, 2]), _i("eight", 8), _i("one", [1]), _i("m12", [-1, 2]), _i("sm1", [-1]),
                        _i("sbig", [-(2**62)]), _i("s0", [0]), _i("m1", [-1]), _i("z0", [0]), _i("end", [end]),
                        _i("ax2", [2])])
        r = compile_model(p, tmp_path / "repo", CompileOptions.for_target("triton-v1.12", f"pad{end}", verify=True))
        assert r.verification["ok"]
        m = read_mcpir(tmp_path / "repo" / f"pad{end}" / "1" / "model.mcpir")
        assert str(m.graph.outputs[0].type) == "tensor(float[N,3,(H + 4),(W + 2)])"
        assert "max_batch_size: 8" in (tmp_path / "repo" / f"pad{end}" / "config.pbtxt").read_text()
