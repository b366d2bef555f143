"""The `triton-v1.12` target: a Triton Inference Server model repository."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import onnxruntime

from mcp_compiler.ir import Model

from ..base import EmitResult, Target, TargetOptions
from ..ort_support import SupportTable
from .params import ServingParams


class TritonTarget(Target):
    name: ClassVar[str] = "triton-v1.12"
    description: ClassVar[str] = ("Triton Inference Server model repository: python backend "
                                  "(MCP-IR + bundled runtime on onnxruntime) or onnxruntime backend")
    runtime: ClassVar[str] = f"onnxruntime {onnxruntime.__version__} (CPU)"
    # What the onnxruntime this target runs with has kernels for, probed from it (ort_support.json).
    support: ClassVar[SupportTable] = SupportTable()
    # Older than 7 is outside what its kernels are registered for; the newest opset is the one
    # the support table found onnxruntime loading models of.
    opset_range: ClassVar[tuple[int, int]] = (7, support.max_opset)

    # Operator domains the onnxruntime CPU build has kernels in (besides model-local functions).
    domains: ClassVar[frozenset[str]] = frozenset({
        "", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental",
        "ai.onnx.preview.training", "ai.onnx.training"})

    def check(self, model: Model) -> list[str]:
        from mcp_compiler.errors import UnsupportedError

        warnings = super().check(model)
        local = {(f.domain, f.name) for f in model.functions}
        for g in model.all_graphs():
            for n in g.nodes:
                if n.domain not in self.domains and (n.domain, n.op_type) not in local:
                    raise UnsupportedError(
                        f"target {self.name} runs on {self.runtime}, which has no operator domain "
                        f"{n.domain!r}", node=n.name or None, op=f"{n.domain}.{n.op_type}",
                        hint="no rewrite rule makes it legal")
        return warnings

    def legalize_passes(self) -> list:
        # The serving runtime hands onnxruntime initializers as views of the mapped .mcpir, but
        # must embed Constant-node tensors in the protobuf: weights belong in initializers.
        # Then what onnxruntime has no kernel for is rewritten, or conversion stops naming it.
        from mcp_compiler.passes.normalize import ConstantToInitializerPass
        from mcp_compiler.passes.rewrite import LegalizePass

        return [ConstantToInitializerPass(), LegalizePass(self.support, strict=True)]

    def emit(self, model: Model, out_dir: Path, options: TargetOptions) -> EmitResult:
        from .emit import emit_repository

        params = options.serving.get("params") or ServingParams()
        return emit_repository(model, out_dir, options, params)
