"""Reading and writing `.mcpir` files (the MCP-IR FlatBuffer plus its aligned data section)."""

from .reader import from_buffer, is_mcpir, read_mcpir
from .writer import WriteStats, to_bytes, write_mcpir

__all__ = ["WriteStats", "from_buffer", "is_mcpir", "read_mcpir", "to_bytes", "write_mcpir"]
