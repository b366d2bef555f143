"""Hardening round 5 (issue 62): TLS material is checked for real before a server starts or a
connection is made. serve used to read PEM labels only: a key of another certificate, an
encrypted key, a header-only or truncated certificate reached tritonserver and came back after
7-9 s as "Socket ... already in use" (exit 1); an expired certificate was served without a word.
Each is now one line, exit 2, before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _helpers import closed_port, one_error

pytest.importorskip("cryptography", reason="cryptography not installed (pip install -e '.[serve]')")
import _tls  # (after the skip: it needs cryptography)

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


def _cli(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def _serve(tmp_path, *tls):
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    return _cli("serve", str(repo), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *tls)


def _bad(tmp_path):
    """name -> (certificate, key) files, each wrong in one way."""
    cert, key = _tls.server_pair(tmp_path)
    other_cert, other_key = _tls.server_pair(tmp_path, name="other")
    expired = _tls.server_pair(tmp_path, days=-1, start_days=-30, name="expired")
    to_come = _tls.server_pair(tmp_path, days=60, start_days=3, name="to_come")
    encrypted = _tls.write_key(tmp_path / "enc.key", _tls.key(), password=b"secret")
    header = tmp_path / "header.pem"
    header.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    truncated = tmp_path / "truncated.pem"
    text = cert.read_text()
    truncated.write_text(text[: len(text) // 2] + "\n-----END CERTIFICATE-----\n")
    garbage_key = tmp_path / "garbage.key"
    garbage_key.write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    return {"another pair's key": ((cert, other_key), "is not the private key of certificate"),
            "encrypted key": ((cert, encrypted), "is encrypted"),
            "header-only certificate": ((header, key), "does not parse"),
            "truncated certificate": ((truncated, key), "does not parse"),
            "expired certificate": (expired, "expired on"),
            "certificate to come": (to_come, "is not valid before"),
            "garbage key": ((cert, garbage_key), "does not parse as a private key"),
            "good": ((cert, key), None), "other": ((other_cert, other_key), None)}


CASES = ["another pair's key", "encrypted key", "header-only certificate", "truncated certificate",
         "expired certificate", "certificate to come", "garbage key"]


@pytest.mark.parametrize("case", CASES)
def test_serve_refuses_bad_tls_material_in_one_line_before_the_server_starts(tmp_path, case):
    (cert, key), expect = _bad(tmp_path)[case]
    r = _serve(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key))
    one_error(r, 2, expect)
    assert "Socket" not in r.stderr and "already in use" not in r.stderr


def test_an_expired_client_ca_is_refused(tmp_path):
    cases = _bad(tmp_path)
    (cert, key), _ = cases["good"]
    (ca, _key), _ = cases["expired certificate"]
    one_error(_serve(tmp_path, "--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(ca)),
              2, "expired on")


@pytest.mark.parametrize("case", ["another pair's key", "encrypted key", "truncated certificate", "expired certificate"])
def test_a_client_with_bad_tls_material_is_refused_before_connecting(tmp_path, case):
    cases = _bad(tmp_path)
    (ca, _), _ = cases["good"]
    (cert, key), expect = cases[case]
    r = _cli("status", "--url", f"grpcs://127.0.0.1:{closed_port()}", "--root-cert", str(ca),
             "--client-cert", str(cert), "--client-key", str(key))
    one_error(r, 2, expect)


def test_a_certificate_expiring_soon_is_a_note(tmp_path):
    from mcp_compiler.targets.triton.commands_serving import _tls as check

    cert, key = _tls.server_pair(tmp_path, days=3)
    tls = check(cert, key, None)
    assert len(tls.notes) == 1 and "expires on" in tls.notes[0] and str(cert) in tls.notes[0]
    cert, key = _tls.server_pair(tmp_path, days=90, name="long")
    assert check(cert, key, None).notes == []
