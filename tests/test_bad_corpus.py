"""Every case of the generated bad-input corpus: one clear error line, exit 2, nothing written,
no traceback, no crash, no hang, no file opened outside the case's folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bad_inputs
import pytest

pytestmark = pytest.mark.slow  # about 1,000 hostile inputs

TIMEOUT_S = 60
# Unknown custom domains are valid ONNX that the target's runtime cannot run: an
# unsupported-model error (exit 1, naming node and op), not bad input.
UNSUPPORTED = {"unknown_domain"}

# Runs the CLI with an audit hook that records every file Python opens.
AUDITED = r'''
import os, sys, json
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.append(os.fsdecode(args[0]))
sys.addaudithook(hook)
sys.argv = ["mcp-cli"] + sys.argv[2:]
from mcp_compiler.cli import app
try:
    app()
finally:
    with open(os.environ["MCP_AUDIT_LOG"], "w") as f:
        json.dump(opened, f)
'''


def _run_case(name: str, src: Path | list[str], tmp: Path) -> dict:
    """A model case (src: the file to convert) or a command-line case (src: the arguments, with
    OUT for the folder it may write into)."""
    out = tmp / "out" / name
    out.mkdir(parents=True)
    audit = tmp / "audit" / f"{name}.json"
    audit.parent.mkdir(exist_ok=True)
    env = dict(os.environ, MCP_AUDIT_LOG=str(audit))
    if isinstance(src, list):
        args = [str(out) + a[3:] if a.startswith("OUT/") else a for a in src]
        folder = tmp / "cli" / name
    else:
        args = ["convert", "--input", str(src), "--target", "triton-v1.12", "--output", str(out / "repo")]
        folder = src.parent
    cmd = [sys.executable, "-c", AUDITED, "-", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"name": name, "rc": "timeout"}
    opened = json.loads(audit.read_text()) if audit.exists() else []
    return {"name": name, "rc": r.returncode, "stderr": r.stderr, "stdout": r.stdout,
            "written": sorted(str(p.relative_to(out)) for p in out.rglob("*")), "opened": opened,
            "folder": str(folder)}


@pytest.fixture(scope="module")
def corpus_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    cases = {**bad_inputs.build(tmp / "cases"), **bad_inputs.build_cli(tmp / "cli")}
    with ThreadPoolExecutor(2) as ex:
        results = list(ex.map(lambda kv: _run_case(kv[0], kv[1], tmp), cases.items()))
    print(f"\nbad-input corpus: {len(results)} cases")
    return results


def test_corpus_is_large(corpus_results):
    assert len(corpus_results) >= 50
    assert sum(r["name"] in bad_inputs.cli_cases() for r in corpus_results) >= 20


def test_every_case_fails_cleanly(corpus_results):
    bad = []
    for r in corpus_results:
        want = 1 if r["name"] in UNSUPPORTED else 2
        lines = [ln for ln in r.get("stderr", "").splitlines() if ln.strip()]
        problems = []
        if r["rc"] != want:
            problems.append(f"exit {r['rc']} (want {want})")
        if "Traceback" in r.get("stderr", "") or "internal error" in r.get("stderr", ""):
            problems.append("traceback / internal error")
        if len(lines) != 1 or not lines[0].startswith("error: "):
            problems.append(f"stderr is not one error line: {lines[:3]}")
        if r.get("written"):
            problems.append(f"wrote {r['written']}")
        if problems:
            bad.append(f"{r['name']}: {'; '.join(problems)}")
    assert not bad, "\n".join(bad)


def test_nothing_read_outside_the_case_folder(corpus_results):
    # Files Python opened that are neither the interpreter's own (site-packages, stdlib), nor the
    # case's folder, nor /proc or /dev: e.g. /etc/passwd through a hostile external-data path.
    import sysconfig

    allowed = [os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, *sysconfig.get_paths().values(),
                                              str(Path(__file__).resolve().parents[1]), "/proc", "/dev", "/tmp"}]
    system = {"/etc/os-release"}  # read by the platform module at import, whatever the input
    leaks = []
    for r in corpus_results:
        for p in r.get("opened", []):
            real = os.path.realpath(p)
            if p in system or real in {os.path.realpath(s) for s in system}:
                continue
            if real.startswith("/etc/") or real.endswith("_outside.bin") or not any(real.startswith(a) for a in allowed):
                leaks.append(f"{r['name']}: opened {p}")
    assert not leaks, "\n".join(leaks)
