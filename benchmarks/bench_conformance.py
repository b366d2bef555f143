"""ONNX node conformance counts into RESULTS.md: onnxruntime direct, after the MCP-IR round trip,
and after the round trip plus the triton-v1.12 target's legalization.

    python benchmarks/bench_conformance.py
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, versions
from _results import table, write_section

from mcp_compiler.conformance import collect_cases, run_all, summarize


def main() -> None:
    t0 = time.perf_counter()
    results = run_all(collect_cases())
    s = summarize(results)
    secs = time.perf_counter() - t0
    outcomes = ", ".join(f"{k} {v}" for k, v in s["direct_outcomes"].items())
    by_rule = Counter()
    for r in results:
        if r.name in s["legalized_only_pass"]:
            kinds = {x.split(": ", 1)[1].split(" ")[0] for x in r.rules or []}
            by_rule[" + ".join(sorted(kinds))] += 1
    body = "\n\n".join([
        "## ONNX node conformance (round trip, legalization)",
        f"Written by `python benchmarks/bench_conformance.py` ({secs:.0f} s). Machine: {machine()}. "
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + ".",
        "Each of onnx's node test cases runs in onnxruntime as given, after ONNX -> IR -> .mcpir "
        "-> IR -> ONNX, and after that plus the triton-v1.12 target's legalization (opset "
        "downgrade, ONNX function bodies, exact dtype widening; `mcp_compiler.passes.rewrite.legalize`), "
        "each compared with the case's expected outputs at its own rtol/atol. "
        f"Outcomes of the direct runs: {outcomes}. (`run` failures are mostly int4/uint4/float4/"
        "int2 inputs, which onnxruntime's Python API cannot be fed; `load` failures are missing "
        "kernels.)",
        table(["cases", "onnxruntime direct pass", "round-trip pass", "with legalization",
               "pass directly, fail through mcp-cli", "pass only through mcp-cli"],
              [[s["cases"], s["ort_direct_pass"], s["roundtrip_pass"], s["legalized_pass"],
                len(set(s["regressions"]) | set(s["legalized_regressions"])), len(s["legalized_only_pass"])]]),
        "Cases only mcp-cli makes pass, by the rules that fired: "
        + ", ".join(f"{k} {v}" for k, v in by_rule.most_common()) + ".",
        "The cases: " + ", ".join(f"`{n}`" for n in s["legalized_only_pass"]) + ".",
    ])
    write_section("conformance", body)
    print(body)


if __name__ == "__main__":
    main()
