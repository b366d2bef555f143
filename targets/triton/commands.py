"""The Triton target's commands, registered on the mcp-cli app through `TritonTarget.commands()`:
each parses its options, calls this package's library code, and renders through the shared
reporter. By group: commands_verify (the convert side), commands_serving (serve, deploy, status,
undeploy), commands_measure (bench, tune), commands_kube (`deploy --kserve`), commands_common
(what they share)."""

from __future__ import annotations

from .commands_llm import generate
from .commands_measure import bench, tune
from .commands_serving import deploy, serve, server_status, undeploy
from .commands_verify import verify

COMMANDS = [serve, verify, deploy, server_status, undeploy, bench, tune, generate]
