"""mcp_runtime: runs a .mcpir file with onnxruntime (or OpenVINO). Needs numpy, flatbuffers and the engine only.

This package is copied into each model repository's version folder by mcp-cli (with the
FlatBuffers code generated from mcp_ir.fbs and the buffer verifier); it never imports mcp-cli.
"""

__all__ = ["Decoder", "MCPIRError", "MCPIRModel", "RunTimeout", "SequenceState", "StateTableFull", "cache_dir_for", "execution"]


def __getattr__(name: str) -> object:
    """The runtime's names load on first use: `params` (the config's keys, standard library only)
    is read by mcp-cli itself without loading onnxruntime or the FlatBuffers code."""
    if name in ("MCPIRError", "MCPIRModel", "RunTimeout", "cache_dir_for", "execution"):
        from . import runtime

        return getattr(runtime, name)
    if name in ("Decoder", "greedy"):
        from . import decoder

        return getattr(decoder, name)
    if name in ("SequenceState", "StateTableFull"):
        from . import sequences

        return getattr(sequences, name)
    raise AttributeError(name)
