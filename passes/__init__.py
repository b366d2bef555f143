"""Pass framework and passes (installed as mcp_compiler.passes)."""
