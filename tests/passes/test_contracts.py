"""Pass contracts: what a pass requires is checked before anything runs, what it does not
preserve is dropped, what it establishes is checked after it (--verify-each), emit requires
target-legal; rule passes say why a site did not fire."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _helpers import save_model
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcp_compiler.frontend import load_onnx
from mcp_compiler.ir import Model
from mcp_compiler.passes import ContractError, Pass, PassContext, PassManager, PassResult, PipelineError, Property
from mcp_compiler.passes.normalize import DeadCodeEliminationPass, MatMulAddToGemmPass
from mcp_compiler.passes.shapes import SymbolicShapesPass


def _mlp(tmp_path: Path, bias_shape=(3,)) -> Path:
    rng = np.random.default_rng(0)
    return save_model(tmp_path, "m", [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                                      helper.make_node("Add", ["h", "b"], ["y"], name="add"),
                                      helper.make_node("Relu", ["x"], ["unused"], name="dead")],
                      [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 3])],
                      [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
                       numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np.float32), "b")])


SHAPES = frozenset({Property.SHAPES_INFERRED})


class ClaimsNoDeadCode(Pass):
    """Claims what DCE establishes, and does nothing."""

    name = "claims-no-dead-code"
    establishes = frozenset({Property.NO_DEAD_CODE})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        return PassResult(model, False)


class NeedsNoDeadCode(Pass):
    name = "needs-no-dead-code"
    requires = frozenset({Property.NO_DEAD_CODE})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        return PassResult(model, False)


class Rewrites(Pass):
    """Modifies the model and preserves nothing."""

    name = "rewrites"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        return PassResult(model, True)


def test_verify_each_catches_a_pass_that_breaks_its_claim(tmp_path):
    model = load_onnx(_mlp(tmp_path)).model
    with pytest.raises(ContractError, match=r"claims-no-dead-code claims .*no-dead-code: node 'dead' is unused"):
        PassManager([ClaimsNoDeadCode()], PassContext(verify_each=True)).run(model)
    # the same claim from the pass that keeps it holds
    pm = PassManager([DeadCodeEliminationPass()], PassContext(verify_each=True))
    pm.run(model)
    assert Property.NO_DEAD_CODE in pm.properties


def test_claims_are_only_checked_with_verify_each(tmp_path, verify_each_pass):
    model = load_onnx(_mlp(tmp_path)).model
    PassManager.global_instruments.remove(verify_each_pass)   # conftest attaches it to every manager
    try:
        PassManager([ClaimsNoDeadCode()], PassContext(verify_each=False)).run(model)   # no check: no error
    finally:
        PassManager.global_instruments.append(verify_each_pass)


def test_verify_each_catches_a_new_model_object_and_a_broken_preserved_property(tmp_path):
    from mcp_compiler.passes._infra import VerifyEach

    class NewModel(DeadCodeEliminationPass):
        name = "returns-new-model"

        def run(self, model, ctx):
            import copy

            return PassResult(copy.copy(model), False)

    class KeepsDeadCode(DeadCodeEliminationPass):   # says it preserves no-dead-code, then leaves a weight unused
        name = "leaves-a-dead-weight"
        establishes = frozenset()

        def run(self, model, ctx):
            add = next(n for n in model.graph.nodes if n.op_type == "Add")
            add.set_input(1, add.inputs[0])   # y = h + h: the bias b is left unused
            return PassResult(model, True)

    model = load_onnx(_mlp(tmp_path)).model
    with pytest.raises(ContractError, match="returned another model object"):
        PassManager([NewModel()], instruments=[VerifyEach()]).run(model)
    PassManager([DeadCodeEliminationPass()]).run(model)
    with pytest.raises(ContractError, match=r"no-dead-code \(preserved\)"):
        PassManager([DeadCodeEliminationPass(), KeepsDeadCode()], instruments=[VerifyEach()]).run(model)


def test_print_ir_is_an_instrument(tmp_path, verify_each_pass):
    from mcp_compiler.passes._infra import PrintIR

    model = load_onnx(_mlp(tmp_path)).model
    got = []
    PassManager([DeadCodeEliminationPass()], instruments=[PrintIR({"dead-code-elimination"},
                                                                  sink=lambda name, text: got.append((name, text)))]).run(model)
    assert got and got[0][0] == "dead-code-elimination" and got[0][1].startswith("// IR after dead-code-elimination")


def test_what_a_pass_does_not_preserve_is_dropped():
    with pytest.raises(PipelineError, match="needs-no-dead-code requires no-dead-code"):
        PassManager([DeadCodeEliminationPass(), Rewrites(), NeedsNoDeadCode()])
    PassManager([DeadCodeEliminationPass(), NeedsNoDeadCode()])   # kept when nothing in between
    # at run time a pass that did not modify the model keeps everything
    pm = PassManager([DeadCodeEliminationPass(), SymbolicShapesPass()])
    assert pm.steps


def test_rule_pass_explains_sites_that_did_not_fire(tmp_path):
    model = load_onnx(_mlp(tmp_path, bias_shape=(1, 1, 3))).model
    SymbolicShapesPass().run(model, PassContext())
    r = MatMulAddToGemmPass().run(model, PassContext(explain={"matmul-add-to-gemm"}))
    assert not r.modified and r.stats["fired"] == 0
    [miss] = r.stats["not_fired"]
    assert miss["node"] == "add" and "C's shape [1, 1, 3] is not [N] or [1, N]" in miss["why"][0]


def test_rule_pass_claims_no_rule_fires_after_it(tmp_path):
    """A rule pass whose rules still match after it ran breaks its claim."""
    model = load_onnx(_mlp(tmp_path)).model
    SymbolicShapesPass().run(model, PassContext())

    class Lazy(MatMulAddToGemmPass):
        name = "lazy-gemm"

        def run(self, model, ctx):
            return PassResult(model, False)

    assert Lazy().remaining(model)
    with pytest.raises(ContractError, match="gemms_formed still matches at add"):
        PassManager([Lazy()], PassContext(verify_each=True), initial=SHAPES).run(model)
    PassManager([MatMulAddToGemmPass()], PassContext(verify_each=True), initial=SHAPES).run(model)


def test_emit_requires_target_legal(tmp_path, monkeypatch):
    """Without the target's legalize pass in the pipeline, emit checks legality itself."""
    from mcp_compiler import CompileOptions, compile_model
    from mcp_compiler.errors import UnsupportedError
    from mcp_compiler.options import PipelineOptions
    from mcp_compiler.targets import TARGETS
    from mcp_compiler.targets.triton import TritonTarget

    class Picky(TritonTarget):
        name = "picky"

        def is_legal(self, model):
            return [f"{n.name}: Relu is not allowed" for n in model.graph.nodes if n.op_type == "Relu"]

        def legalize_passes(self):
            return []

    monkeypatch.setitem(TARGETS, "picky", Picky)
    options = CompileOptions.for_target("picky")
    options.pipeline = PipelineOptions(passes=["fold-constants"])
    with pytest.raises(UnsupportedError, match="cannot run 1 node"):
        compile_model(_mlp(tmp_path), tmp_path / "repo", options)
    assert not (tmp_path / "repo").exists()


def test_print_ir_after(tmp_path):
    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    r = CliRunner().invoke(app, ["convert", str(_mlp(tmp_path)), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                                 "--print-ir-after", "matmul-add-to-gemm", "--print-ir-after", "dead-code-elimination"])
    assert r.exit_code == 0, r.output
    assert "// IR after matmul-add-to-gemm\n" in r.stderr and "= Gemm(%x: float[N, 4], %w: float[4, 3], %b: float[3])" in r.stderr
    assert r.stderr.count("// IR after dead-code-elimination") >= 2
    r = CliRunner().invoke(app, ["convert", str(_mlp(tmp_path)), "-o", str(tmp_path / "x.mcpir"),
                                 "--print-ir-after", "no-such-pass", "--passes", "fold-constants"])
    assert r.exit_code == 2 and "--print-ir-after: unknown pass 'no-such-pass'" in r.stderr


def test_explain_names_the_sub_pattern_that_failed(tmp_path):
    """x * HardSigmoid-like Clip(x + 3, 0, 6) / 6 with 7 for 6 in the Div: the reason names the
    constant deepest into the pattern, not just "no match"."""
    from mcp_compiler.passes.normalize import FuseHardSwishPass

    path = save_model(tmp_path, "hs", [helper.make_node("Add", ["x", "three"], ["a"], name="add"),
                                       helper.make_node("Clip", ["a", "zero", "six"], ["c"], name="clip"),
                                       helper.make_node("Div", ["c", "seven"], ["y"], name="div")],
                      [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4])],
                      [numpy_helper.from_array(np.array(v, np.float32), k)
                       for k, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0), ("seven", 7.0))])
    model = load_onnx(path).model
    r = FuseHardSwishPass().run(model, PassContext(explain={"fuse-hardswish"}))
    assert not r.modified
    [miss] = [m for m in r.stats["not_fired"] if m["node"] == "div"]
    assert any("input 1 of Div is the constant 7, not 6" in why for why in miss["why"]), miss


def test_identity_elimination_explains_its_sites(tmp_path):
    """A hand-written pass on the rule engine explains too: a Cast that changes the type stays."""
    from mcp_compiler.passes.normalize import IdentityEliminationPass

    path = save_model(tmp_path, "cast", [helper.make_node("Cast", ["x"], ["y"], name="cast", to=TP.DOUBLE)],
                      [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                      [helper.make_tensor_value_info("y", TP.DOUBLE, ["N", 4])])
    model = load_onnx(path).model
    r = IdentityEliminationPass().run(model, PassContext(explain={"identity-elimination"}))
    assert r.stats["not_fired"] == [{"node": "cast", "op": "Cast", "why": ["nodes_removed: not a no-op"]}]


def test_time_passes_is_an_instrument(tmp_path):
    from mcp_compiler.passes._infra import TimePasses

    model = load_onnx(_mlp(tmp_path)).model
    got = []
    pm = PassManager([DeadCodeEliminationPass(), SymbolicShapesPass(), DeadCodeEliminationPass()],
                     instruments=[TimePasses(sink=got.append)])
    _, records = pm.run(model)
    [text] = got
    ran = [r for r in records if not r.skipped]
    assert text.startswith("// pass times: ") and f"in {len(ran)} runs" in text
    dce = next(ln for ln in text.splitlines() if ln.endswith("dead-code-elimination"))
    assert dce.split()[3] == str(sum(r.name == "dead-code-elimination" for r in ran))
    assert ("skipped" in text.splitlines()[0]) == (len(ran) < len(records))


def test_an_idempotent_pass_is_skipped_until_the_model_changes(tmp_path):
    """A pass whose run left a fixed point is not run again while no pass changed the model;
    once one does, it runs again."""
    from mcp_compiler.passes.normalize import IdentityEliminationPass

    x = helper.make_tensor_value_info("x", TP.FLOAT, [2])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["x"], ["dead"]),
             helper.make_node("Identity", ["r"], ["i"]), helper.make_node("Neg", ["i"], ["y"])]
    path = save_model(tmp_path, "m", nodes, [x], [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    model = load_onnx(path).model
    dce = DeadCodeEliminationPass
    pm = PassManager([dce(), dce(), IdentityEliminationPass(), dce(), IdentityEliminationPass(), dce()])
    _, records = pm.run(model)
    assert [(r.name, r.modified, r.skipped) for r in records] == [
        ("dead-code-elimination", True, False),    # the dead Relu
        ("dead-code-elimination", False, True),    # nothing changed since: skipped
        ("identity-elimination", True, False),
        ("dead-code-elimination", False, False),   # the model changed: runs (and finds nothing)
        ("identity-elimination", False, True),
        ("dead-code-elimination", False, True)]
    assert records[1].stats == {"skipped": "the model is unchanged since its last run"}
    assert [n.op_type for n in model.graph.nodes] == ["Relu", "Neg"]


def test_a_pass_that_keeps_shape_inferences_fixed_point_does_not_rerun_it(tmp_path):
    """deduplicate-weights merges equal initializers: shape inference after it would find what it
    found before, so it stays skipped (and the record says why); --verify-each checks the claim."""
    from mcp_compiler.passes._infra import VerifyEach
    from mcp_compiler.passes.normalize import DeduplicateWeightsPass

    x = helper.make_tensor_value_info("x", TP.FLOAT, ["N", 2])
    w = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("a", "b")]
    nodes = [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    path = save_model(tmp_path, "m", nodes, [x], [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 2])], w)
    model = load_onnx(path).model
    pm = PassManager([SymbolicShapesPass(), DeduplicateWeightsPass(), SymbolicShapesPass()],
                     instruments=[VerifyEach()])
    _, records = pm.run(model)
    assert [(r.name, r.modified, r.skipped) for r in records] == [
        ("infer-shapes", False, False), ("deduplicate-weights", True, False), ("infer-shapes", False, True)]
    assert records[2].stats == {"skipped": "the model changed since its last run only by deduplicate-weights, "
                                           "which keep its fixed point"}
    assert model.graph.nodes[1].inputs[1] is model.graph.nodes[0].inputs[1]
    assert model.graph.outputs[0].type.shape == ("N", 2)


def test_verify_each_catches_a_pass_that_does_not_keep_the_fixed_point_it_claims(tmp_path, monkeypatch):
    from mcp_compiler.passes._infra import VerifyEach

    class ShrinksAnInput(Pass):   # a shape inference would see the graph input change
        name = "shrinks-an-input"
        preserves = frozenset()
        keeps_fixed_points = frozenset({"infer-shapes"})

        def run(self, model: Model, ctx: PassContext) -> PassResult:
            from mcp_compiler.ir import DataType, TensorType

            model.graph.inputs[0].type = TensorType(DataType.FLOAT, (1, 2))
            return PassResult(model, True)

    x = helper.make_tensor_value_info("x", TP.FLOAT, ["N", 2])
    path = save_model(tmp_path, "m", [helper.make_node("Relu", ["x"], ["y"])], [x],
                      [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 2])])
    model = load_onnx(path).model
    pm = PassManager([SymbolicShapesPass(), ShrinksAnInput(), SymbolicShapesPass()], instruments=[VerifyEach()])
    with pytest.raises(ContractError, match="keeps infer-shapes's fixed point .*infer-shapes changed the model after it"):
        pm.run(model)
    # without the check, the manager trusts the claim: the second inference is skipped
    monkeypatch.setattr(PassManager, "global_instruments", [])
    model = load_onnx(path).model
    _, records = PassManager([SymbolicShapesPass(), ShrinksAnInput(), SymbolicShapesPass()]).run(model)
    assert records[2].skipped


def test_time_passes_flag(tmp_path):
    from typer.testing import CliRunner

    from mcp_compiler.cli import app

    r = CliRunner().invoke(app, ["convert", str(_mlp(tmp_path)), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                                 "--time-passes"])
    assert r.exit_code == 0, r.output
    assert "// pass times:" in r.stderr and "infer-shapes" in r.stderr
    r = CliRunner().invoke(app, ["convert", str(_mlp(tmp_path)), "-o", str(tmp_path / "m.mcpir"), "--time-passes"])
    assert r.exit_code == 2 and "--time-passes need a pipeline" in r.stderr
