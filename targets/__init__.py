"""Targets: named profiles of what a serving runtime accepts, and how to emit for it.

Installed as `mcp_compiler.targets`. `TARGETS` is the one table of known targets.
"""

from __future__ import annotations

from .base import EmitResult, Target, TargetOptions
from .onnx_file import OnnxTarget
from .triton import TritonTarget

TARGETS: dict[str, type[Target]] = {TritonTarget.name: TritonTarget, OnnxTarget.name: OnnxTarget}


def get_target(name: str) -> Target:
    """The target called `name`; raises UnknownTargetError listing the known ones."""
    from mcp_compiler.errors import UnknownTargetError

    try:
        return TARGETS[name]()
    except KeyError:
        raise UnknownTargetError(name, sorted(TARGETS)) from None


__all__ = ["TARGETS", "EmitResult", "Target", "TargetOptions", "get_target"]
