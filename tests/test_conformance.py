"""ONNX node conformance: every case that onnxruntime passes directly passes after a round trip."""

from __future__ import annotations

import pytest

from mcp_compiler.conformance import collect_cases, run_all, summarize


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
