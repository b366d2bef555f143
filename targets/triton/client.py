"""The one way this target talks to a Triton server: URLs (`parse_url`), a `Connection` (address,
protocol, TLS, token), the sync client (`client`) and the asyncio gRPC one (`aio_client`), one
call wrapper (`call`) and one translation of whatever tritonclient, grpc or gevent raise into the
CLI's errors (`server_error`: unreachable, auth, TLS, the other protocol's port, a polling server).
deploy, status, undeploy, bench, tune, cold starts and the benchmarks use it."""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mcp_compiler.errors import McpError, ServerAuthError, ServerError, ServerLoadError, ServerUnreachableError, UsageError

# gRPC's C core logs what it refuses (TLS, a certificate it cannot parse, a header, a connection)
# on stderr, beside the one error line server_error makes of the same failure; read when the first
# channel starts, so set before any client here is made. GRPC_VERBOSITY=ERROR shows them again.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

SCHEMES = {"grpc": ("grpc", False), "grpcs": ("grpc", True), "http": ("http", False), "https": ("http", True)}


def parse_url(url: str, protocol: str | None = None, ssl: bool = False) -> tuple[str, str, bool]:
    """`--url` as users write it -> (HOST:PORT, protocol, ssl). Takes HOST:PORT (protocol from
    `protocol`, default grpc), grpc://, grpcs://, http:// and https:// (the scheme picks the
    protocol and TLS), with or without a trailing slash; `[::1]:8001` for IPv6."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme.lower() not in SCHEMES:
            raise UsageError(f"--url {url!r}: unknown scheme {scheme!r} (grpc://, http://, https:// or HOST:PORT)")
        proto, tls = SCHEMES[scheme.lower()]
        if protocol is not None and protocol != proto:
            raise UsageError(f"--url {url!r} is {proto} but --protocol says {protocol}: give one")
        ssl = ssl or tls
    else:
        rest, proto = text, protocol or "grpc"
    rest = rest.rstrip("/")
    host, colon, port = rest.rpartition(":")
    if not colon or not host or "/" in rest or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise UsageError(f"--url: expected HOST:PORT, grpc://HOST:PORT or http://HOST:PORT, got {url!r}")
    return f"{host}:{int(port)}", proto, ssl


@dataclass
class Connection:
    url: str
    protocol: str = "grpc"
    ssl: bool = False
    root_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    token: str | None = None
    token_header: str = "mcp-api-key"
    timeout: float = 60.0

    def headers(self) -> dict[str, str] | None:
        if not self.token:
            return None
        # Triton's restricted gRPC protocols expect "triton-grpc-protocol-<key>"; HTTP, the key itself.
        key = f"triton-grpc-protocol-{self.token_header}" if self.protocol == "grpc" else self.token_header
        return {key: self.token}

    def describe(self) -> str:
        tls = " over TLS" + (" (mutual)" if self.client_cert else "") if self.ssl else ""
        return f"{self.protocol}{'s' if self.ssl else ''}://{self.url}{tls}"


def client(conn: Connection):  # noqa: ANN201 - a tritonclient InferenceServerClient
    if conn.protocol == "grpc":
        import tritonclient.grpc as tg

        args = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]
        cert, key = client_pair(conn)
        return tg.InferenceServerClient(conn.url, ssl=conn.ssl, root_certificates=pem_path(conn.root_cert),
                                        private_key=key, certificate_chain=cert, channel_args=args)
    if conn.protocol == "http":
        import tritonclient.http as th

        if conn.client_cert and not conn.ssl:
            raise UsageError("--client-cert needs --ssl")
        opts = {}
        if conn.ssl:
            if conn.root_cert:
                opts["ca_certs"] = pem_path(conn.root_cert)
            if conn.client_cert:
                opts["certfile"], opts["keyfile"] = client_pair(conn)
        return th.InferenceServerClient(conn.url, ssl=conn.ssl, ssl_options=opts or None,
                                        connection_timeout=conn.timeout, network_timeout=conn.timeout)
    raise UsageError(f"--protocol must be grpc or http, got {conn.protocol!r}")


def pem_path(p: Path | None, kind: str = "certificate") -> str | None:
    """A PEM file for TLS, checked (pem.py): `certificate` (every certificate parses and is
    within its dates) or `key` (a private key that parses, not encrypted). A folder, FIFO,
    device, empty, garbage or truncated file, or a PEM of another kind is one line naming it,
    before any connection."""
    from . import pem

    if p is None:
        return None
    if kind == "certificate":
        pem.certificates(Path(p))
    else:
        pem.private_key(Path(p))
    return str(p)


def client_pair(conn: Connection) -> tuple[str | None, str | None]:
    """The client's certificate and key (mutual TLS), checked and checked to be one pair."""
    from . import pem

    if conn.client_cert is None or conn.client_key is None:
        return pem_path(conn.client_cert), pem_path(conn.client_key, "key")
    pem.pair(Path(conn.client_cert), Path(conn.client_key))
    return str(conn.client_cert), str(conn.client_key)


_AUTH = ("restricted", "expecting header", "unauthenticated", "permission denied")
_AUTH_STATUS = re.compile(r"(?<![\d:.])40[13](?![\d.])")   # HTTP 401/403, not a port like :40111
_UNREACHABLE = ("unavailable", "connection refused", "failed to connect", "connect call failed",
                "name or service not known", "no route", "timed out", "timeout", "deadline exceeded",
                "temporary failure in name resolution", "cannot assign requested address")
_TLS = ("ssl", "handshake", "certificate", "tls", "wrong_version_number")


def server_error(conn: Connection, e: BaseException, doing: str) -> McpError:
    """One clear line for what went wrong talking to the server: unreachable, refused
    credentials (token or TLS), or anything else the server answered."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    low = msg.lower()
    if any(s in low for s in _AUTH) or _AUTH_STATUS.search(low):
        return ServerAuthError(f"{conn.describe()} refused {doing} (token missing or wrong?): {msg}")
    if "certificate_verify_failed" in low:
        return ServerAuthError(f"TLS with {conn.describe()} failed while {doing}: the server's certificate does not "
                               f"verify against {conn.root_cert or 'the system CAs'} (give --root-cert, the CA that "
                               f"signed it): {msg}")
    if any(s in low for s in _TLS):
        return ServerAuthError(f"TLS with {conn.describe()} failed while {doing}: {msg}")
    if conn.ssl and "socket closed" in low and _listening(conn):
        # a TLS server that closes the handshake on its side: gRPC says only "Socket closed"
        mine = (f"its certificate {conn.client_cert} was refused (not from the CA the server trusts?)"
                if conn.client_cert else "it asks for a client certificate (mutual TLS): give --client-cert and "
                                         "--client-key, from the CA the server trusts")
        return ServerAuthError(f"{conn.describe()} refused the TLS handshake while {doing}: {mine}")
    if polling(low):
        return ServerError(f"{conn.describe()} refuses loads and unloads while {doing}: it polls its repository "
                           "folder (Triton's --model-control-mode=poll; `mcp-cli serve --poll`). Start it with "
                           "`mcp-cli serve DIR` (loads DIR's models and accepts deploys) or --model-control-mode=explicit")
    hint = _other_protocol_hint(conn, low)
    if hint:
        return ServerUnreachableError(f"{conn.describe()} does not answer {conn.protocol} while {doing}: {hint}")
    if any(s in low for s in _UNREACHABLE):
        return ServerUnreachableError(f"cannot reach Triton at {conn.describe()} while {doing}: {msg}")
    return ServerError(f"{conn.describe()}: {doing} failed: {msg}")


def _listening(conn: Connection) -> bool:
    """Whether something accepts TCP connections at the connection's address."""
    import socket

    host, _, port = conn.url.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=min(conn.timeout, 3)):
            return True
    except (OSError, ValueError):
        return False


def polling(low: str) -> bool:
    """Triton's refusal of a load/unload when it polls its repository folder (lower-cased text)."""
    return "polling is enabled" in low or "explicit model load / unload is not allowed" in low


def _other_protocol_hint(conn: Connection, low: str) -> str | None:
    """A port that speaks the other protocol (Triton's HTTP port given to a gRPC client, or the
    reverse) fails with a transport error that names neither; ask the port the other way."""
    if conn.ssl:
        return None
    if conn.protocol == "grpc" and "socket closed" in low:
        try:
            with urllib.request.urlopen(f"http://{conn.url}/v2/health/live", timeout=min(conn.timeout, 3)):
                pass
        except urllib.error.HTTPError:
            pass   # an HTTP answer all the same
        except (OSError, ValueError):
            return None
        return f"{conn.url} is an HTTP port (Triton's HTTP endpoint?): use --url http://{conn.url}, or the gRPC port"
    if conn.protocol == "http" and ("expected http/" in low or "parse" in low or "remotedisconnected" in low):
        return f"{conn.url} does not speak HTTP/1.1 (Triton's gRPC port?): use --url grpc://{conn.url}, or the HTTP port"
    return None


def load_error(conn: Connection, e: BaseException, name: str, version: int) -> McpError:
    """The server answered its metadata, so it is reachable: a failed load is the model's."""
    err = server_error(conn, e, f"loading {name} v{version}")
    if isinstance(err, ServerAuthError):
        return err
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if polling(msg.lower()):   # the server's mode, not the model: server_error's own line says so
        return err
    return ServerLoadError(f"{conn.describe()} failed to load {name} v{version}: {msg}")


def call(conn: Connection, doing: str, fn, *args, **kw):  # noqa: ANN001, ANN201 - what fn returns
    try:
        return fn(*args, **kw)
    except McpError:
        raise
    except Exception as e:  # noqa: BLE001 - tritonclient/grpc/gevent raise many kinds
        raise server_error(conn, e, doing) from None


def infer_inputs(feeds: dict, kind: str = "aio") -> list:
    """tritonclient InferInputs carrying `feeds`, for the client `kind`: "grpc" or "http" (the
    sync clients: a Connection's protocol) or "aio" (bench's asyncio gRPC client)."""
    import importlib

    from tritonclient.utils import np_to_triton_dtype

    mod = importlib.import_module({"grpc": "tritonclient.grpc", "http": "tritonclient.http",
                                   "aio": "tritonclient.grpc.aio"}[kind])
    inputs = []
    for k, v in feeds.items():
        t = mod.InferInput(k, list(v.shape), np_to_triton_dtype(v.dtype))
        t.set_data_from_numpy(v)
        inputs.append(t)
    return inputs


def aio_client(conn: Connection):  # noqa: ANN201 - tritonclient.grpc.aio.InferenceServerClient
    import tritonclient.grpc.aio as aio

    if conn.protocol != "grpc":
        raise UsageError("bench and tune measure over gRPC: give the server's gRPC port (--protocol grpc)")
    cert, key = client_pair(conn)
    return aio.InferenceServerClient(conn.url, ssl=conn.ssl, root_certificates=pem_path(conn.root_cert),
                                     private_key=key, certificate_chain=cert)
