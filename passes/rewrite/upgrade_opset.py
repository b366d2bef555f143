"""Raise the model's ai.onnx opset with onnx's version converter (weights never copied)."""

from __future__ import annotations

from mcp_compiler.ir import Model

from .._infra import Pass, PassContext, PassResult


class UpgradeOpsetPass(Pass):
    """ai.onnx opset v -> ctx.min_opset when v is lower (else nothing changes).

    The graph is lowered with every weight left out (external data naming the in-memory tensor),
    converted by `onnx.version_converter` (its adapters rewrite each op whose schema changed,
    e.g. Unsqueeze axes attribute -> input at 13), and imported back holding the same tensors.
    Models with functions or subgraph-carrying ops are converted too; the converter raises on
    ops it has no adapter for, and the pass fails naming it.
    """

    name = "upgrade-opset"
    requires = frozenset()
    establishes = frozenset()
    preserves = frozenset()

    def __init__(self, min_opset: int | None = None) -> None:
        self.min_opset = min_opset

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        import onnx
        from onnx import version_converter

        from mcp_compiler.frontend.onnx import import_by_reference, to_onnx_by_reference

        want = self.min_opset or ctx.min_opset
        key = "" if "" in model.opset_imports or "ai.onnx" not in model.opset_imports else "ai.onnx"
        have = model.opset_imports.get(key)
        if want is None or have is None or have >= want:
            return PassResult(model, False, {"from": have or 0, "to": have or 0})
        proto, tensors = to_onnx_by_reference(model)
        try:
            converted = version_converter.convert_version(proto, want)
        except Exception as e:  # noqa: BLE001 - onnx raises RuntimeError/ValueError/IndexError
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"onnx version converter cannot take opset {have} to {want}: {first}") from None
        converted.ir_version = max(converted.ir_version, onnx.helper.find_min_ir_version_for(
            [converted.opset_import[i] for i in range(len(converted.opset_import))], True))
        new = import_by_reference(converted, tensors)
        # Keep the Model object (callers hold it): move the converted contents in.
        model.graph, model.functions = new.graph, new.functions
        model.opset_imports, model.ir_version = new.opset_imports, new.ir_version
        return PassResult(model, True, {"from": have, "to": want})
