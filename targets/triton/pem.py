"""TLS material checked for real before any server starts or connection is made: certificates
parse (every block of the file) and are within their validity dates, a private key parses and is
not encrypted (tritonserver and gRPC take no passphrase), and a key belongs to the certificate it
is given with. Each refusal is one UsageError line naming the file (exit 2). Parsing is the
`cryptography` package's (the serve extra)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from mcp_compiler.errors import UsageError

LIMIT = 1 << 20                          # a PEM file over 1 MiB is not one
SOON = dt.timedelta(days=14)             # a certificate expiring within this is warned about

_CERT = re.compile(rb"-----BEGIN (?:TRUSTED )?CERTIFICATE-----")
_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")


def _what(kind: str) -> str:
    return "certificate file" if kind == "certificate" else "key file"


def _crypto() -> Any:  # the cryptography.x509 module
    try:
        from cryptography import x509
    except ImportError:
        raise UsageError("checking TLS files needs the cryptography package: pip install 'mcp-cli[serve]'") from None
    return x509


def _read(p: Path, kind: str) -> bytes:
    from mcp_compiler.files import read_regular

    what = _what(kind)
    if not Path(p).exists():
        raise UsageError(f"{what} {p} does not exist")
    data = read_regular(p, what, limit=LIMIT)
    if b"-----BEGIN " not in data:
        raise UsageError(f"{what} {p} is {'empty' if not data.strip() else 'not PEM'} "
                         "(expected -----BEGIN ...----- blocks)")
    if not (_CERT if kind == "certificate" else _KEY).search(data):
        found = re.search(rb"-----BEGIN ([A-Z0-9 ]+)-----", data)
        raise UsageError(f"{what} {p} holds no {'CERTIFICATE' if kind == 'certificate' else 'PRIVATE KEY'} block "
                         f"(found {found.group(1).decode() if found else 'none'})")
    return data


def certificates(p: Path, now: dt.datetime | None = None) -> list[Any]:
    """The certificates of a PEM file, first (the leaf of a chain) first: each parses and is
    valid now (not expired, not yet to come)."""
    x509 = _crypto()
    data = _read(p, "certificate")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise UsageError(f"certificate file {p} does not parse as X.509 ({_first(e)}): truncated or not a certificate") from None
    now = now or dt.datetime.now(dt.timezone.utc)
    for c in certs:
        try:   # (cryptography parses a certificate's fields when first asked for them)
            subject = c.subject.rfc4514_string() or "(no subject)"
            c.public_key()
        except Exception as e:  # noqa: BLE001 - ValueError, UnsupportedAlgorithm: a field that does not parse
            raise UsageError(f"certificate file {p} does not parse as X.509 ({_first(e)})") from None
        if c.not_valid_after_utc < now:
            raise UsageError(f"certificate file {p}: {subject} expired on {c.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        if c.not_valid_before_utc > now:
            raise UsageError(f"certificate file {p}: {subject} is not valid before "
                             f"{c.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    return certs


def private_key(p: Path) -> Any:
    """The private key of a PEM file: it parses and needs no passphrase."""
    _crypto()
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    data = _read(p, "key")
    try:
        return load_pem_private_key(data, password=None)
    except TypeError:   # "Password was not given but private key is encrypted"
        raise UsageError(f"key file {p} is encrypted: tritonserver and gRPC take no passphrase "
                         f"(decrypt it: openssl pkey -in {p} -out KEY.pem)") from None
    except (ValueError, Exception) as e:  # noqa: BLE001 - cryptography's parse errors (ValueError, UnsupportedAlgorithm)
        raise UsageError(f"key file {p} does not parse as a private key ({_first(e)})") from None


def pair(cert: Path, key: Path) -> list[Any]:
    """A certificate and its private key, each checked, and the key the certificate's: the
    certificates (leaf first)."""
    from cryptography.hazmat.primitives import serialization

    certs = certificates(cert)
    k = private_key(key)
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if k.public_key().public_bytes(*spki) != certs[0].public_key().public_bytes(*spki):
        raise UsageError(f"key file {key} is not the private key of certificate {cert} "
                         f"({certs[0].subject.rfc4514_string() or 'its first certificate'}): "
                         "a key from another certificate pair")
    return certs


def expiring(certs: list[Any], path: Path, now: dt.datetime | None = None) -> list[str]:
    """Notes for the certificates of `path` that expire within SOON."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return [f"certificate {path} ({c.subject.rfc4514_string() or 'no subject'}) expires on "
            f"{c.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, in {(c.not_valid_after_utc - now).days} day(s)"
            for c in certs if c.not_valid_after_utc - now < SOON]


def _first(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
