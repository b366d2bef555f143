"""MCP-IR FlatBuffers schema (mcp_ir.fbs) and the Python code flatc generates from it."""

from __future__ import annotations

from importlib import resources

# The schema version this package writes and the major version it reads. Bump minor when fields
# are appended (old readers ignore them), major when the meaning of existing fields changes.
SCHEMA_VERSION = (1, 0, 0)
FILE_IDENTIFIER = b"MCPI"
FILE_EXTENSION = ".mcpir"


def schema_text() -> str:
    """The text of mcp_ir.fbs as installed with the package."""
    return resources.files(__name__).joinpath("mcp_ir.fbs").read_text(encoding="utf-8")
