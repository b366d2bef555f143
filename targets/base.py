"""The Target protocol: the op/opset range a runtime accepts, its rewrite rules, its emitter."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from mcp_compiler.ir import Model


@dataclass
class TargetOptions:
    """Per-conversion options a target reads (serving parameters, backend, name)."""

    name: str | None = None
    backend: str = "python"
    force: bool = False
    serving: dict[str, Any] = field(default_factory=dict)
    load_check: bool = True          # the target's runtime loads the staged artifacts first
    # Called with the staged entry before it replaces anything (e.g. verify); raising stops the emit.
    check: Callable[[Path], None] | None = None


@dataclass
class EmitResult:
    root: Path                       # the model's folder: DIR/NAME
    files: list[str]                 # paths relative to `root`, sorted
    config: Any = None               # the ModelConfig message written to config.pbtxt
    warnings: list[str] = field(default_factory=list)


class Target(abc.ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    runtime: ClassVar[str]           # what executes the emitted model, by version
    opset_range: ClassVar[tuple[int, int]]   # default-domain opsets accepted

    def check(self, model: Model) -> list[str]:
        """Raise UnsupportedError if the model is outside what the target accepts; return warnings."""
        from mcp_compiler.errors import UnsupportedError

        lo, hi = self.opset_range
        ver = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        if ver is not None and not lo <= ver <= hi:
            raise UnsupportedError(
                f"target {self.name} accepts ai.onnx opsets {lo}..{hi}, the model imports {ver}",
                hint="convert the model to a supported opset first")
        return []

    def legalize_passes(self) -> list:
        """The target's rewrite rules, run after normalization (passes from mcp_compiler.passes)."""
        return []

    @abc.abstractmethod
    def emit(self, model: Model, out_dir: Path, options: TargetOptions) -> EmitResult:
        """Write the target's artifacts for `model` under `out_dir`, atomically."""
