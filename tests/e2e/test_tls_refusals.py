"""TLS refusals against a real tritonserver with mutual TLS (issue 62 round 5, issue 60): a
client with no certificate or one from a foreign CA used to read "cannot reach Triton at
grpc://..." (the server closes the handshake and gRPC says only "Socket closed"); a wrong CA
read a raw handshake error. Each now says which TLS check failed, with the grpcs:// URL."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _helpers import one_error

pytestmark = pytest.mark.slow  # a real Triton

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver")
pytest.importorskip("cryptography", reason="cryptography not installed (pip install -e '.[serve]')")
import _tls  # (after the skips: it needs cryptography)

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def _pki(d):
    ca_key = _tls.key()
    ca = _tls.cert(ca_key, "mcp-test-ca", ca=True)
    other_key = _tls.key()
    other = _tls.cert(other_key, "foreign-ca", ca=True)
    out = {"ca.pem": _tls.write_cert(d / "ca.pem", ca), "foreign-ca.pem": _tls.write_cert(d / "foreign-ca.pem", other)}
    for who, issuer in (("server", (ca, ca_key)), ("client", (ca, ca_key)), ("foreign", (other, other_key))):
        k = _tls.key()
        out[f"{who}.pem"] = _tls.write_cert(d / f"{who}.pem", _tls.cert(k, "localhost", issuer=issuer))
        out[f"{who}.key"] = _tls.write_key(d / f"{who}.key", k)
    return out


def test_mutual_tls_refusals_say_what_tls_refused(tmp_path):
    from mcp_compiler.targets.triton.serve import TritonServer

    c = _pki(tmp_path)
    (tmp_path / "empty").mkdir()
    args = ["--grpc-use-ssl=true", "--grpc-use-ssl-mutual=true", f"--grpc-server-cert={c['server.pem']}",
            f"--grpc-server-key={c['server.key']}", f"--grpc-root-cert={c['ca.pem']}"]
    with TritonServer(tmp_path / "empty", explicit=True, extra_args=args) as s:
        url = f"grpcs://{s.grpc_url}"

        def status(*extra):
            return subprocess.run([*CLI, "status", "--url", url, "--timeout", "10", *extra],
                                  capture_output=True, text=True, timeout=120)

        one_error(status("--root-cert", str(c["ca.pem"])), 1, url, "refused the TLS handshake",
                  "asks for a client certificate")
        one_error(status("--root-cert", str(c["ca.pem"]), "--client-cert", str(c["foreign.pem"]),
                         "--client-key", str(c["foreign.key"])), 1, url, "refused the TLS handshake",
                  f"its certificate {c['foreign.pem']} was refused")
        one_error(status("--root-cert", str(c["foreign-ca.pem"]), "--client-cert", str(c["client.pem"]),
                         "--client-key", str(c["client.key"])), 1, url, "does not verify against")
        r = status("--root-cert", str(c["ca.pem"]), "--client-cert", str(c["client.pem"]), "--client-key",
                   str(c["client.key"]))
        assert r.returncode == 0, r.stderr
