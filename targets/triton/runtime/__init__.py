"""mcp_runtime: runs a .mcpir file with onnxruntime. Needs numpy, flatbuffers and onnxruntime only.

This package is copied into each model repository's version folder by mcp-cli (with the
FlatBuffers code generated from mcp_ir.fbs and the buffer verifier); it never imports mcp-cli.
"""

from .runtime import MCPIRError, MCPIRModel, execution
from .sequences import SequenceState, StateTableFull

__all__ = ["MCPIRError", "MCPIRModel", "SequenceState", "StateTableFull", "execution"]
