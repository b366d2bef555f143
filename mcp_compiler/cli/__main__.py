"""`python -m mcp_compiler.cli`: the same as the `mcp-cli` command."""

from . import entry

entry()
