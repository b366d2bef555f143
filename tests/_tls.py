"""Real TLS material for tests, made with the cryptography package: a CA, certificates it signs
(valid, expired, to come, expiring soon), keys (plain or encrypted), written as PEM files."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NOW = dt.datetime.now(dt.timezone.utc)


def key():
    return ec.generate_private_key(ec.SECP256R1())


def cert(subject_key, cn: str, *, issuer=None, days: float = 30, start_days: float = -1, ca: bool = False):
    """A certificate for `subject_key` named `cn`, valid from NOW+start_days to NOW+days, signed by
    `issuer` (a (certificate, key) pair) or by itself."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    issuer_name, signer = (issuer[0].subject, issuer[1]) if issuer else (name, subject_key)
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name)
         .public_key(subject_key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(NOW + dt.timedelta(days=start_days)).not_valid_after(NOW + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]),
                            critical=False)
    return b.sign(signer, hashes.SHA256())


def write_cert(path: Path, *certs) -> Path:
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs))
    return path


def write_key(path: Path, k, password: bytes | None = None) -> Path:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    path.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc))
    return path


def server_pair(d: Path, *, days: float = 30, start_days: float = -1, name: str = "server") -> tuple[Path, Path]:
    k = key()
    return write_cert(d / f"{name}.pem", cert(k, "localhost", days=days, start_days=start_days)), write_key(d / f"{name}.key", k)
