"""ONNX node conformance: every case that onnxruntime passes directly passes after a round trip."""

from __future__ import annotations

import pytest

from mcp_compiler.conformance import collect_cases, run_all, summarize

pytestmark = pytest.mark.slow  # the 1,884 ONNX node cases


@pytest.fixture(scope="module")
def summary():
    return summarize(run_all(collect_cases()))


def test_all_cases_collected(summary):
    assert summary["cases"] == 1884


def test_no_case_lost_in_the_round_trip(summary):
    print(f"\nconformance: {summary['cases']} cases, ORT direct pass {summary['ort_direct_pass']}, "
          f"round-trip pass {summary['roundtrip_pass']}")
    assert summary["regressions"] == []
    # Sanity floor: a harness that broke feeding inputs would pass nothing on either side.
    assert summary["ort_direct_pass"] > 1500
    assert summary["roundtrip_pass"] >= summary["ort_direct_pass"]


def test_legalization_loses_nothing_and_gains_cases(summary):
    print(f"with legalization: {summary['legalized_pass']} "
          f"(only through mcp-cli: {len(summary['legalized_only_pass'])})")
    assert summary["legalized_regressions"] == []
    gained = set(summary["legalized_only_pass"])
    # one case per rule kind: opset downgrade, widening, function body, and bfloat16 through float
    assert {"test_dequantizelinear", "test_roialign_aligned_true", "test_max_int16",
            "test_pow_types_float32_uint32", "test_swiglu",
            "test_attention_3d_causal_bf16"} <= gained
    assert summary["legalized_pass"] == summary["ort_direct_pass"] + len(gained)
