"""The `triton-v1.12` target: a Triton Inference Server model repository.

Everything Triton-specific lives in this package: serving parameters and the build file
(`params`), the config.pbtxt builder (`config`), the repository writer (`emit`), the serving
runtime (`runtime/`), repository verification (`verify`), a local server (`serve`), deploy,
status and undeploy on a running one (`deploy`), and their CLI commands (`commands`). The rest of
mcp-cli reaches it only through `TritonTarget`, the `Target` interface.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from ..base import EmitResult, ParsedOptions, Target, TargetOptions
from .params import OPTION_TYPES


class TritonTarget(Target):
    name: ClassVar[str] = "triton-v1.12"
    description: ClassVar[str] = ("Triton Inference Server model repository: python backend "
                                  "(MCP-IR + bundled runtime on onnxruntime) or onnxruntime backend")
    option_types: ClassVar[Mapping[str, type]] = OPTION_TYPES
    nullable_options: ClassVar[frozenset[str]] = frozenset({"dynamic_batch"})   # null: decide from the model

    # Operator domains the onnxruntime CPU build has kernels in (besides model-local functions).
    domains: ClassVar[frozenset[str]] = frozenset({
        "", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental",
        "ai.onnx.preview.training", "ai.onnx.training"})

    @property
    def runtime(self) -> str:
        from importlib.metadata import version

        return f"onnxruntime {version('onnxruntime')} (CPU)"

    @cached_property
    def support(self):  # noqa: ANN201 - ort_support.SupportTable (imports onnx and onnxruntime)
        """What the onnxruntime this target runs with has kernels for, probed from it (ort_support.json)."""
        from ..ort_support import SupportTable

        return SupportTable()

    @property
    def opset_range(self) -> tuple[int, int]:
        # Older than 7 is outside what its kernels are registered for; the newest opset is the one
        # the support table found onnxruntime loading models of (read without importing onnx).
        from ..base import probed_max_opset

        return (7, probed_max_opset())

    # --- options and names -------------------------------------------------------------------
    def convert_flags(self) -> list:
        from .flags import convert_flags

        return convert_flags()

    def settings_from_flags(self, given: Mapping[str, Any]) -> dict[str, Any]:
        from .flags import settings_from_flags

        return settings_from_flags(given)

    def options_from(self, flags: Mapping[str, Any], build_file: Mapping[str, Any] | None = None,
                     source: str = "the build file") -> ParsedOptions:
        from .params import resolve

        return ParsedOptions(resolve(dict(build_file or {}), dict(flags), source))

    # --- compile -----------------------------------------------------------------------------
    def check(self, model) -> list[str]:  # noqa: ANN001 - mcp_compiler.ir.Model
        warnings = super().check(model)
        self.check_ops(model)
        return warnings

    def check_ops(self, model) -> None:  # noqa: ANN001 - mcp_compiler.ir.Model
        from mcp_compiler.errors import UnsupportedError

        for n in self._foreign(model):
            raise UnsupportedError(
                f"target {self.name} runs on {self.runtime}, which has no operator domain "
                f"{n.domain!r}", node=n.name or None, op=f"{n.domain}.{n.op_type}",
                hint="no rewrite rule makes it legal")

    def _foreign(self, model) -> list:  # noqa: ANN001
        local = {(f.domain, f.name) for f in model.functions}
        return [n for g in model.all_graphs() for n in g.nodes
                if n.domain not in self.domains and (n.domain, n.op_type) not in local]

    def legalize_passes(self) -> list:
        # The serving runtime hands onnxruntime initializers as views of the mapped .mcpir, but
        # must embed Constant-node tensors in the protobuf: weights belong in initializers.
        # Then what onnxruntime has no kernel for is rewritten, or conversion stops naming it.
        from mcp_compiler.passes.normalize import ConstantToInitializerPass
        from mcp_compiler.passes.rewrite import LegalizePass

        return [ConstantToInitializerPass(), LegalizePass(self.support, strict=True)]

    def is_legal(self, model) -> list[str]:  # noqa: ANN001
        from mcp_compiler.passes.rewrite.legalize import illegal_nodes

        return [f"{n.name or '(unnamed)'}: domain {n.domain!r}" for n in self._foreign(model)] + \
            illegal_nodes(model, self.support)

    def emit(self, model, out_dir: Path, options: TargetOptions) -> EmitResult:  # noqa: ANN001
        from .emit import emit_repository
        from .params import ServingParams

        return emit_repository(model, out_dir, options, options.params or ServingParams())

    # --- after emitting ----------------------------------------------------------------------
    def verify(self, original: Path, entry: Path, **kw: Any):  # noqa: ANN201 - reference.VerifyReport
        from .verify import verify

        return verify(original, entry, **kw)

    def install(self, entry: Path, out_dir: Path, name: str) -> Path:
        from .emit import install_entry

        return install_entry(entry, out_dir, name)

    def commands(self) -> list[Callable]:
        from .commands import COMMANDS

        return COMMANDS
