"""mcp-cli: ONNX -> MCP-IR -> Triton Inference Server model repository.

The library's entry points: `compile_model(input, output, CompileOptions(...))` returning a
`CompileReport`, `load_model`, `inspect`; errors in `mcp_compiler.errors`. They load on first
use (`mcp-cli --version` imports none of onnx, onnxruntime or numpy).
"""

from __future__ import annotations  # no typing import: a Ctrl-C at start meets mcp-cli's own handler sooner

from ._version import __version__

_LAZY = {"compile_model": "api", "CompileReport": "api", "load_model": "api", "inspect": "api",
         "CompileOptions": "options"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CompileOptions", "CompileReport", "__version__", "compile_model", "inspect", "load_model"]
