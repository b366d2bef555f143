"""The pass pipeline: the default one keeps outputs, plans are checked first, failures name the pass."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _exact_cases import F, X, _same_outputs
from _helpers import ZOO_INPUTS, golden_dirs, zoo_params
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.passes import PASSES, PassContext, PassManager, PipelineError, Property, Repeat
from mcp_compiler.passes.normalize import (
    ConstantToInitializerPass,
    DeadCodeEliminationPass,
    IdentityEliminationPass,
)
from mcp_compiler.pipeline import default_pipeline


@pytest.mark.parametrize("src", [d / "model.onnx" for d in golden_dirs()] + zoo_params(),
                         ids=lambda p: p.parent.name if p.name == "model.onnx" else p.stem)
def test_default_pipeline_preserves_outputs(src):
    from mcp_compiler.targets import get_target

    model = load_onnx(src).model
    pm = PassManager(default_pipeline(get_target("triton-v1.12")), PassContext(verify_each=True))
    _, records = pm.run(model)
    assert records and all(r.nodes_after <= r.nodes_before for r in records)
    if src.name in ZOO_INPUTS:
        feeds = {"x": np.random.default_rng(0).random(ZOO_INPUTS[src.name], dtype=np.float32)}
    else:
        feeds = dict(np.load(src.parent / "inputs.npz"))
    # the default pipeline includes the fusions (BN folding, ...): float32 rounding of folded weights
    _same_outputs(src, model, feeds, rtol=1e-4, atol=1e-5)


def test_plan_is_checked_before_running():
    class NeedsLegal(IdentityEliminationPass):
        name = "needs-legal"
        requires = frozenset({Property.TARGET_LEGAL})

    with pytest.raises(PipelineError, match="needs-legal requires target-legal"):
        PassManager([ConstantToInitializerPass(), NeedsLegal()])
    PassManager([Repeat([DeadCodeEliminationPass()])])  # fine


def test_pass_failure_names_the_pass(tmp_path, tiny_model):
    from mcp_compiler.passes import PassError

    class Broken(IdentityEliminationPass):
        name = "broken"

        def run(self, model, ctx):
            raise RuntimeError("boom")

    onnx.save(tiny_model, tmp_path / "t.onnx")
    model = load_onnx(tmp_path / "t.onnx").model
    with pytest.raises(PassError, match=r"pass broken failed \(after dead-code-elimination\): RuntimeError: boom"):
        PassManager([DeadCodeEliminationPass(), Broken()]).run(model)


def test_registry_names_are_kebab_case():
    assert all(n == c.name and n == n.lower() and n.replace("-", "").isalnum() and n[0].isalpha()
               for n, c in PASSES.items())


def test_default_pipeline_on_a_model_with_functions(tmp_path):
    # Constants inside a function body must stay nodes: FunctionProto has no initializers.
    from mcp_compiler.targets import get_target

    fn = helper.make_function(
        "custom", "AddOne", ["a"], ["b"],
        [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones(3, np.float32))),
         helper.make_node("Identity", ["one"], ["one2"]),
         helper.make_node("Add", ["a", "one2"], ["b"])], [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("AddOne", ["x"], ["y"], domain="custom")], "g",
                          [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                          functions=[fn])
    m.ir_version = 8
    onnx.save(m, tmp_path / "f.onnx")
    model = load_onnx(tmp_path / "f.onnx").model
    PassManager(default_pipeline(get_target("triton-v1.12")), PassContext(verify_each=True)).run(model)
    body = [n.op_type for n in model.functions[0].body.nodes]
    assert body == ["Constant", "Add"]  # Identity removed, Constant kept
    _same_outputs(m, model, {"x": X})
