"""Argo Rollouts' own schemas, for the tests: npm `@kubernetes-models/argo-rollouts` 2.0.0 (MIT),
generated from argo-rollouts' v1alpha1 Go types, pinned with its 27 dependencies by integrity
hash in tests/argo_schemas/package-lock.json and installed once with `npm ci` into the cache
(~/.cache/mcp-cli/npm/, 27 MB, ~5 s).

Two checks of a Rollout or AnalysisTemplate: the package's validators (ajv: types, enums, required
fields), run by node; and unknown fields, which those validators let through (no
additionalProperties in the generated code), from the package's type declarations: every field of
a document must be one its interface declares, down to where Kubernetes' own types begin (the pod
template is validated against Kubernetes' schema by the product itself).

Where node or npm is missing the tests skip, unless MCP_CLI_REQUIRE_FETCH is set (CI)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "argo_schemas"
PREFIX = "IComGithubArgoprojArgoRolloutsPkgApisRolloutsV1alpha1"


def _unavailable(why: str) -> None:
    if os.environ.get("MCP_CLI_REQUIRE_FETCH"):
        raise RuntimeError(f"Argo Rollouts' schemas are required here (MCP_CLI_REQUIRE_FETCH): {why}")
    pytest.skip(why)


@lru_cache(maxsize=1)
def installed() -> Path:
    """The folder holding node_modules/ of the pinned lock (made once; a half-made one is redone)."""
    if not (shutil.which("node") and shutil.which("npm")):
        _unavailable("node and npm are not installed")
    lock = (HERE / "package-lock.json").read_bytes()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mcp-cli" / "npm"
    d = base / f"argo-rollouts-{hashlib.sha256(lock).hexdigest()[:12]}"
    if not (d / "complete").is_file():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        for f in ("package.json", "package-lock.json", "check.mjs"):
            shutil.copy(HERE / f, d / f)
        r = subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=d, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            shutil.rmtree(d, ignore_errors=True)
            _unavailable(f"npm ci failed: {r.stderr.strip()[-300:]}")
        (d / "complete").write_text("ok\n")
    return d


def validate(docs: list[dict]) -> list[str | None]:
    """The package's validators on each document: None where it passes, else its message."""
    d = installed()
    r = subprocess.run(["node", str(d / "check.mjs")], cwd=d, input=json.dumps(docs), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@lru_cache(maxsize=1)
def _interfaces() -> dict[str, dict[str, tuple]]:
    """Type name (less the prefix) -> field -> ("ref", name) | ("list", kind) | ("other",)."""
    root = installed() / "node_modules" / "@kubernetes-models" / "argo-rollouts" / "argoproj.io" / "v1alpha1"
    out = {}
    for f in root.glob("*.d.ts"):
        # the declared class, not the interface: it lists the fields an interface inherits too
        m = re.search(r"export declare class (\w+) extends Model<I\w+> implements I\w+ \{\n(.*?)\n\}", f.read_text(),
                      re.S)
        if not m:
            continue
        body = re.sub(r"/\*\*.*?\*/", "", m.group(2), flags=re.S)
        fields = {}
        for fm in re.finditer(r'^    "([^"]+)"\??: (.+?);?$', body, re.M):
            fields[fm.group(1)] = _kind(fm.group(2))
        out[m.group(1)] = fields
    assert {"Rollout", "RolloutSpec", "AnalysisTemplate", "Metric"} <= set(out), sorted(out)[:20]
    return out


def _kind(t: str) -> tuple:
    t = t.strip()
    if t.startswith("Array<") and t.endswith(">"):
        return ("list", _kind(t[6:-1]))
    if t.startswith(PREFIX):
        return ("ref", t[len(PREFIX):])
    return ("other",)   # a scalar, a literal, a map, or one of Kubernetes' own types


def unknown_fields(doc: dict) -> list[str]:
    """The paths of `doc`'s fields no interface of its kind declares."""
    types = _interfaces()
    bad: list[str] = []

    def walk(v: object, kind: tuple, path: str) -> None:
        if kind[0] == "list" and isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, kind[1], f"{path}[{i}]")
        elif kind[0] == "ref" and isinstance(v, dict):
            fields = types.get(kind[1])
            if fields is None:
                return   # a union or alias type the declarations spell otherwise: not judged
            for k, x in v.items():
                if k not in fields:
                    bad.append(f"{path}.{k}".lstrip("."))
                else:
                    walk(x, fields[k], f"{path}.{k}")

    walk(doc, ("ref", doc.get("kind", "")), "")
    return bad
