"""mcp-cli: ONNX -> MCP-IR -> Triton Inference Server model repository."""

from ._version import __version__

__all__ = ["__version__"]
