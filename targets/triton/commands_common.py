"""What the Triton target's commands share: the `command` mark (name and examples), the
connection flags every client command takes (`with_connection`, checked once), Triton's ports."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from mcp_compiler.cli.common import Choice, examples
from mcp_compiler.errors import UsageError

TRITON_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}   # tritonserver's own defaults


def command(name: str, *lines: str | tuple[str, ...]) -> Callable[[Callable], Callable]:
    def mark(fn: Callable) -> Callable:
        fn.__command_name__, fn.__examples__ = name, examples(*lines) if lines else None
        return fn
    return mark


class Protocol(Choice):
    grpc = "grpc"
    http = "http"


@dataclass
class ConnectionFlags:
    """The connection options every command that talks to a running Triton shares (one group,
    declared once: `with_connection`), and the Connection they make."""

    url: Optional[str] = None
    protocol: Optional[str] = None
    ssl: bool = False
    root_cert: Optional[Path] = None
    client_cert: Optional[Path] = None
    client_key: Optional[Path] = None
    token: Optional[str] = None
    token_header: str = "mcp-api-key"
    timeout: float = 60.0
    grpc_only: bool = False

    def connection(self, required: bool = True):  # noqa: ANN201 - client.Connection, or None
        """The Connection, checked; None when no --url was given and none is `required`."""
        import os

        from .client import Connection, parse_url

        if self.url is None:
            if required:
                raise UsageError("missing --url: the Triton server (grpc://HOST:PORT or http://HOST:PORT, as "
                                 "`serve` prints them)")
            if self.ssl or self.root_cert or self.client_cert or self.token:
                raise UsageError("--ssl/--root-cert/--client-cert/--token need --url (a running server)")
            return None
        if (self.client_cert is None) != (self.client_key is None):
            raise UsageError("--client-cert and --client-key go together")
        hostport, proto, ssl = parse_url(self.url, self.protocol, self.ssl)
        if (self.root_cert or self.client_cert) and not ssl:
            raise UsageError("--root-cert/--client-cert need --ssl (or an https:// / grpcs:// --url)")
        if self.grpc_only and proto != "grpc":
            raise UsageError(f"--url {self.url}: bench measures over gRPC; give the server's gRPC port "
                             "(the grpc:// address `serve` prints)")
        token = self.token or os.environ.get("MCP_API_KEY") or None
        _header_fits("--token-header", self.token_header, _HEADER_NAME)
        if token is not None:   # never echoed: it is a secret
            _header_fits("--token (or $MCP_API_KEY)", token, _HEADER_VALUE, show=False)
        return Connection(hostport, proto, ssl, self.root_cert, self.client_cert, self.client_key,
                          token, self.token_header, self.timeout)


_HEADER_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")   # an HTTP token, lower case (gRPC metadata keys)
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")   # printable ASCII, no edge spaces


def _header_fits(flag: str, value: str, pattern: re.Pattern, *, show: bool = True) -> None:
    """What goes into a request header is checked before anything is sent (gRPC refuses a bad
    key or value in its own log lines, after the connection)."""
    if not pattern.fullmatch(value):
        what = f" {value!r}" if show else ""
        raise UsageError(f"{flag}{what} cannot be sent as an HTTP/gRPC header "
                         f"({'letters, digits and -_.!#$%&*+^`|~, lower case' if pattern is _HEADER_NAME else 'printable ASCII'})")


def with_connection(url_help: str = "The Triton server: grpc://HOST:PORT, http://HOST:PORT (as `serve` prints "
                                    "them), or HOST:PORT with --protocol.", *,
                    grpc_only: bool = False) -> Callable[[Callable], Callable]:
    """Declare the connection group on a command: its `conn: ConnectionFlags` parameter becomes
    --url, --protocol (not for gRPC-only commands), --ssl, --root-cert, --client-cert,
    --client-key, --token, --token-header and --timeout, in the "Connection" help panel."""
    import functools
    import inspect

    P = inspect.Parameter
    panel = "Connection"

    def opt(name: str, default, annotation, *decls: str, help: str, **kw) -> inspect.Parameter:  # noqa: ANN001
        return P(name, P.KEYWORD_ONLY, annotation=annotation,
                 default=typer.Option(default, *decls, help=help, rich_help_panel=panel, **kw))

    group = [opt("url", None, Optional[str], "--url", help=url_help)]
    if not grpc_only:
        group.append(opt("protocol", None, Optional[Protocol], "--protocol", case_sensitive=False,
                         help="grpc or http, for a --url without a scheme (default grpc)."))
    group += [
        opt("ssl", False, bool, "--ssl", help="TLS (gRPC; Triton's HTTP endpoint has no TLS of its own)."),
        opt("root_cert", None, Optional[Path], "--root-cert", help="CA certificate to check the server with."),
        opt("client_cert", None, Optional[Path], "--client-cert", help="Client certificate, for mutual TLS."),
        opt("client_key", None, Optional[Path], "--client-key", help="Client private key, for mutual TLS."),
        opt("token", None, Optional[str], "--token", help="Auth token sent as a header (default: $MCP_API_KEY). "
            "Never printed."),
        opt("token_header", "mcp-api-key", str, "--token-header", help="Header that carries the token (the key of "
            "the server's --grpc-restricted-protocol / --http-restricted-api setting)."),
        opt("timeout", 60.0, float, "--timeout", help="Network timeout, seconds."),
    ]
    names = [g.name for g in group]

    def decorate(fn: Callable) -> Callable:
        sig = inspect.signature(fn, eval_str=True)
        params = []
        for p in sig.parameters.values():
            params.extend(group if p.name == "conn" else [p.replace(kind=P.KEYWORD_ONLY)])

        @functools.wraps(fn)
        def wrapper(**kw):  # noqa: ANN202
            given = {n: kw.pop(n) for n in names}
            if given.get("protocol") is not None:
                given["protocol"] = str(given["protocol"])
            return fn(conn=ConnectionFlags(**given, grpc_only=grpc_only), **kw)

        wrapper.__signature__ = sig.replace(parameters=params)
        return wrapper
    return decorate
