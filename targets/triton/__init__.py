"""The `triton-v1.12` target: a Triton Inference Server model repository."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import onnxruntime

from mcp_compiler.ir import Model

from ..base import EmitResult, Target, TargetOptions
from .params import ServingParams


class TritonTarget(Target):
    name: ClassVar[str] = "triton-v1.12"
    description: ClassVar[str] = ("Triton Inference Server model repository: python backend "
                                  "(MCP-IR + bundled runtime on onnxruntime) or onnxruntime backend")
    runtime: ClassVar[str] = f"onnxruntime {onnxruntime.__version__} (CPU)"
    # The onnxruntime this target runs with implements ai.onnx opsets up to 23 (1.22+); older
    # than 7 is outside what its kernels are registered for.
    opset_range: ClassVar[tuple[int, int]] = (7, 23)

    def legalize_passes(self) -> list:
        # The serving runtime hands onnxruntime initializers as views of the mapped .mcpir, but
        # must embed Constant-node tensors in the protobuf: weights belong in initializers.
        from mcp_compiler.passes.normalize import ConstantToInitializerPass

        return [ConstantToInitializerPass()]

    def emit(self, model: Model, out_dir: Path, options: TargetOptions) -> EmitResult:
        from .emit import emit_repository

        params = options.serving.get("params") or ServingParams()
        return emit_repository(model, out_dir, options, params)
