"""The McpError hierarchy: every failure the library reports on purpose.

Each class carries the exit code the CLI ends with (docs/errors.md lists them all):
2 for what the user can fix in the command line or the input files, 1 for a conversion,
verification or server that failed. Anything that is not an McpError is a bug: the CLI prints it
as one `internal error` line and exits 1.
"""

from __future__ import annotations


class McpError(Exception):
    """Base of every error mcp-cli raises on purpose. `exit_code` is what the CLI exits with."""

    exit_code = 1


class UsageError(McpError):
    """The command line or the options are wrong."""

    exit_code = 2


def yaml_usage_error(label: str, e: Exception) -> UsageError:
    """`label line N: not valid YAML (problem)` for a PyYAML error (N when PyYAML knows it)."""
    mark = getattr(e, "problem_mark", None)
    where = f" line {mark.line + 1}" if mark is not None else ""
    problem = " ".join(str(getattr(e, "problem", None) or e).split())  # one line, always
    return UsageError(f"{label}{where}: not valid YAML ({problem})")


class InvalidModelError(McpError):
    """An input file (ONNX or MCP-IR) is corrupt, malformed or hostile."""

    exit_code = 2

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path) if path is not None else None
        self.reason = reason
        super().__init__(f"{self.path}: {reason}" if self.path else reason)


class SchemaVersionError(InvalidModelError):
    """An MCP-IR file written with a schema major version this reader does not know."""


class UnsupportedError(McpError):
    """The model is valid but uses something mcp-cli cannot carry (names the node and op)."""

    exit_code = 1

    def __init__(self, what: str, *, node: str | None = None, op: str | None = None,
                 hint: str | None = None) -> None:
        self.node, self.op, self.hint = node, op, hint
        where = []
        if node is not None:
            where.append(f"node {node!r}")
        if op is not None:
            where.append(f"op {op}")
        msg = f"{what} ({', '.join(where)})" if where else what
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)


class OutputExistsError(McpError):
    """The output path exists and --force was not given."""

    exit_code = 2


class VerificationError(McpError):
    """Converted outputs differ from onnxruntime on the original beyond tolerance."""

    exit_code = 1


class AccuracyError(McpError):
    """A quantized model falls outside --accuracy-budget (nothing is emitted)."""

    exit_code = 1


class UnknownTargetError(UsageError):
    """--target names no known target."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name, self.known = name, known
        super().__init__(f"unknown target {name!r}; known targets: {', '.join(known)}")


class ServerError(McpError):
    """A Triton server could not be started, reached or used."""

    exit_code = 1


class LoadCheckError(McpError):
    """The emitted model does not load in the runtime that would serve it (nothing is written)."""

    exit_code = 1


class OutputError(McpError):
    """An output could not be written (a full disk, an I/O error): names the path."""

    exit_code = 1


class ServerUnreachableError(ServerError):
    """No Triton answers at the address (refused, timed out, not resolvable)."""


class ServerAuthError(ServerError):
    """The server answered but refused the credentials (TLS or token)."""


class ServerLoadError(ServerError):
    """The server is up but could not load the model (its log names the reason)."""


class TimeoutExceededError(McpError):
    """A command ran past its --timeout (verify: a model that runs forever, e.g. a huge Loop)."""

    exit_code = 1


def one_line(text: str, limit: int = 600) -> str:
    """A message of several lines as one, never cut inside a sentence: the whole of it when it
    fits in `limit` characters, else the sentences that fit and a count of what was left out."""
    words = " ".join(text.split())
    if len(words) <= limit:
        return words
    cut = max(words.rfind(". ", 0, limit), words.rfind(": ", 0, limit))
    head = words[:cut + 1] if cut > 0 else words[:limit].rsplit(" ", 1)[0]
    return f"{head} (... {len(words) - len(head)} more characters)"
