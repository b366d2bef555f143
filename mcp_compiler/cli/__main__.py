"""`python -m mcp_compiler.cli`: the same as the `mcp-cli` command."""

from .application import entry

entry()
