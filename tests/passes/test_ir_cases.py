"""Pass tests as text: input IR -> the passes -> expected IR (LLVM FileCheck's style).

Each file under tests/passes/ir/ holds cases split by `// -----`:

    // RUN: fuse-clip                 the passes to run, in order (comma-separated)
    // FIRES: clamps_merged           rules that must fire (each rule of each rule set has a case)
    model (opsets ai.onnx:17)
    graph g(%x: float[N, 4])
      ...
      return %y
    // CHECK: = Clip(%x               found on a later line than the previous CHECK
    // CHECK-NEXT: ...                on the very next line
    // CHECK-NOT: Max                 not between the previous CHECK and the next (or the end)

Beside the text, every case runs the model before and after through onnxruntime on random
inputs (symbolic dims 3): outputs within `// TOL: rtol atol` (default exact), never NaN where
the original is not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _helpers import ort_run, random_feeds

from mcp_compiler.ir.parser import parse_model
from mcp_compiler.ir.printer import print_model
from mcp_compiler.lower import to_onnx
from mcp_compiler.passes import PASSES, PassManager
from mcp_compiler.passes._rules import RuleSetPass

HERE = Path(__file__).parent / "ir"


def _cases() -> list[tuple[str, str]]:
    out = []
    for f in sorted(HERE.glob("*.ir")):
        for i, text in enumerate(f.read_text().split("// -----")):
            if text.strip():
                out.append((f"{f.stem}:{i + 1}", text))
    return out


def _directives(text: str, key: str) -> list[str]:
    return [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.strip().startswith(f"// {key}:")]


def filecheck(output: str, checks: list[tuple[str, str]]) -> None:
    """Match CHECK / CHECK-NEXT / CHECK-NOT lines against `output` in order."""
    lines = output.splitlines()
    at = -1            # line of the last positive match
    pending_not: list[str] = []
    for kind, want in checks:
        if kind == "CHECK-NOT":
            pending_not.append(want)
            continue
        if kind == "CHECK-NEXT":
            found = at + 1 if at + 1 < len(lines) and want in lines[at + 1] else None
        else:
            found = next((i for i in range(at + 1, len(lines)) if want in lines[i]), None)
        assert found is not None, f"{kind}: {want!r} not found after line {at + 1} of:\n{output}"
        for bad in pending_not:
            hit = [ln for ln in lines[at + 1:found] if bad in ln]
            assert not hit, f"CHECK-NOT: {bad!r} found: {hit[0]!r} in:\n{output}"
        pending_not, at = [], found
    for bad in pending_not:
        hit = [ln for ln in lines[at + 1:] if bad in ln]
        assert not hit, f"CHECK-NOT: {bad!r} found: {hit[0]!r} in:\n{output}"


def _checks(text: str) -> list[tuple[str, str]]:
    out = []
    for ln in text.splitlines():
        s = ln.strip()
        for kind in ("CHECK-NEXT", "CHECK-NOT", "CHECK"):
            if s.startswith(f"// {kind}:"):
                out.append((kind, s.split(":", 1)[1].strip()))
                break
    return out


def run_case(text: str) -> tuple[str, dict[str, dict]]:
    """The printed IR after the case's passes, and each pass's stats."""
    [run] = _directives(text, "RUN")
    names = [n.strip() for n in run.split(",")]
    model = parse_model(text)
    before = to_onnx(model)
    _, records = PassManager([PASSES[n]() for n in names]).run(model)
    after = to_onnx(model)
    tol = [float(x) for x in (_directives(text, "TOL") or ["0 0"])[0].split()]
    feeds = random_feeds(before, dims={}, seed=0) if not before.graph.input else \
        random_feeds(before, dims={d.dim_param: 3 for vi in before.graph.input
                                   for d in vi.type.tensor_type.shape.dim if d.dim_param})
    want, got = ort_run(before, feeds), ort_run(after, feeds)
    for w, g in zip(want, got):
        assert not (np.isnan(g) & ~np.isnan(w)).any(), "NaN where the original has none"
        np.testing.assert_allclose(g, w, rtol=tol[0], atol=tol[1])
    stats: dict[str, dict] = {}
    for r in records:
        for k, v in r.stats.items():
            if isinstance(v, int):
                stats.setdefault(r.name, {}).setdefault(k, 0)
                stats[r.name][k] += v
    return print_model(model), stats


CASES = _cases()


@pytest.mark.parametrize("name,text", CASES, ids=[c[0] for c in CASES])
def test_ir_case(name, text):
    out, stats = run_case(text)
    filecheck(out, _checks(text))
    for rule in _directives(text, "FIRES"):
        assert any(s.get(rule, 0) > 0 for s in stats.values()), f"{rule} did not fire: {stats}"


def test_every_rule_has_a_case():
    """Each rule of each rule-set pass fires in some IR-text case."""
    fired = {(run.strip(), rule) for _, text in CASES for run in _directives(text, "RUN")[0].split(",")
             for rule in _directives(text, "FIRES")}
    missing = []
    for name, cls in PASSES.items():
        if not issubclass(cls, RuleSetPass):
            continue
        for rule in {r.name for rnd in cls.rounds for r in rnd}:
            if not any(p == name and r == rule for p, r in fired):
                missing.append(f"{name}: {rule}")
    assert not missing, "rules without an IR-text case: " + ", ".join(sorted(missing))


def test_filecheck_fails_when_it_should():
    out = "a = Relu(x)\nb = Max(a)\nc = Clip(b)\n"
    filecheck(out, [("CHECK", "Relu"), ("CHECK-NEXT", "Max"), ("CHECK-NOT", "Min"), ("CHECK", "Clip")])
    for checks in ([("CHECK", "Clip"), ("CHECK", "Relu")], [("CHECK", "Relu"), ("CHECK-NEXT", "Clip")],
                   [("CHECK", "Relu"), ("CHECK-NOT", "Max"), ("CHECK", "Clip")], [("CHECK-NOT", "Clip")]):
        with pytest.raises(AssertionError):
            filecheck(out, checks)
