"""ONNX node conformance counts into RESULTS.md: onnxruntime direct vs after the MCP-IR round trip.

    python benchmarks/bench_conformance.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, versions  # noqa: E402
from _results import table, write_section  # noqa: E402

from mcp_compiler.conformance import collect_cases, run_all, summarize  # noqa: E402


def main() -> None:
    t0 = time.perf_counter()
    s = summarize(run_all(collect_cases()))
    secs = time.perf_counter() - t0
    outcomes = ", ".join(f"{k} {v}" for k, v in s["direct_outcomes"].items())
    body = "\n\n".join([
        "## ONNX node conformance (round trip)",
        f"Written by `python benchmarks/bench_conformance.py` ({secs:.0f} s). Machine: {machine()}. "
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + ".",
        "Each of onnx's node test cases runs in onnxruntime as given and after ONNX -> IR -> "
        ".mcpir -> IR -> ONNX, compared with the case's expected outputs at its own rtol/atol. "
        f"Outcomes of the direct runs: {outcomes}. (`run` failures are mostly int4/uint4/float4/"
        "int2 inputs, which onnxruntime's Python API cannot be fed; `load` failures are missing "
        "kernels.)",
        table(["cases", "onnxruntime direct pass", "round-trip pass", "pass directly, fail after",
               "pass only after"],
              [[s["cases"], s["ort_direct_pass"], s["roundtrip_pass"], len(s["regressions"]),
                len(s["roundtrip_only_pass"])]]),
    ])
    write_section("conformance", body)
    print(body)


if __name__ == "__main__":
    main()
