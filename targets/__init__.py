"""Targets (installed as mcp_compiler.targets)."""
