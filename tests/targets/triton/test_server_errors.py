"""How a failed call to a server is named: the text a client raises decides the error class,
and a port number in that text must not be read as an HTTP status (CI saw port 40111 taken
for "401" and a refused connection reported as a refused token)."""
import pytest

from mcp_compiler.errors import ServerAuthError, ServerError, ServerUnreachableError
from mcp_compiler.targets.triton.client import Connection, parse_url
from mcp_compiler.targets.triton.client import server_error as _server_error


@pytest.mark.parametrize("port", [401, 403, 4010, 40111, 40311, 14013])
def test_refused_connection_on_any_port_is_unreachable(port):
    conn = Connection(f"127.0.0.1:{port}")
    msg = (f"[StatusCode.UNAVAILABLE] failed to connect to all addresses; last error: UNKNOWN: "
           f"ipv4:127.0.0.1:{port}: Failed to connect to remote host: Connection refused")
    err = _server_error(conn, RuntimeError(msg), "listing models")
    assert type(err) is ServerUnreachableError, err


@pytest.mark.parametrize("msg", ["[401] Unauthorized", "HTTP 403 Forbidden",
                                 "[StatusCode.UNAVAILABLE] This protocol is restricted, expecting header "
                                 "'triton-grpc-protocol-mcp-api-key'"])
def test_refused_credentials_are_auth(msg):
    err = _server_error(Connection("127.0.0.1:8001"), RuntimeError(msg), "listing models")
    assert type(err) is ServerAuthError, err


def test_other_answers_stay_server_errors():
    err = _server_error(Connection("127.0.0.1:8001"), RuntimeError("model 'x' is not found"), "loading x")
    assert type(err) is ServerError


@pytest.mark.parametrize("url, want", [
    ("grpc://127.0.0.1:8001", ("127.0.0.1:8001", "grpc", False)),
    ("grpcs://h:443/", ("h:443", "grpc", True)),
    ("http://127.0.0.1:8000", ("127.0.0.1:8000", "http", False)),
    ("https://h:8443", ("h:8443", "http", True)),
    ("[::1]:8001", ("[::1]:8001", "grpc", False)),
])
def test_urls_as_the_tool_prints_them(url, want):
    assert parse_url(url) == want
