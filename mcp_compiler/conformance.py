"""ONNX node conformance: every case through onnxruntime directly, after an MCP-IR round trip,
and after the round trip plus the target's legalization.

`python -m mcp_compiler.conformance [--json FILE] [--filter SUBSTR]` prints the three counts,
the cases that pass directly but not through mcp-cli (the bar is zero of those), and the cases
only mcp-cli's legalization makes pass. Every result compares with the case's expected outputs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .frontend import load_onnx
from .lower import to_onnx
from .mcpir import from_buffer, to_bytes


@dataclass
class CaseResult:
    name: str
    direct: str       # "pass", or why not: "load: ...", "run: ...", "mismatch: ..."
    roundtrip: str
    legalized: str = ""
    rules: list[str] | None = None   # the legalization rules that fired


def collect_cases(filter_: str | None = None) -> list[Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    return [c for c in cases if not filter_ or filter_ in c.name]


def roundtrip_proto(model: onnx.ModelProto, workdir: Path) -> onnx.ModelProto:
    """ONNX -> IR -> .mcpir bytes -> IR -> ONNX, through the real frontend (file on disk)."""
    return to_onnx(_roundtrip_ir(model, workdir), value_info=True)


def _roundtrip_ir(model: onnx.ModelProto, workdir: Path):  # noqa: ANN202
    path = workdir / "model.onnx"
    path.write_bytes(model.SerializeToString())
    loaded = load_onnx(path)
    return from_buffer(to_bytes(loaded.model))


def legalized_proto(model: onnx.ModelProto, workdir: Path, target: str = "triton-v1.12"):  # noqa: ANN201
    """The round trip, then the target's legalization passes: (proto, rules fired)."""
    from .passes import PassContext, PassManager
    from .targets import get_target

    t = get_target(target)
    ir = _roundtrip_ir(model, workdir)
    _, records = PassManager(t.legalize_passes(), PassContext(target=t)).run(ir)
    rules = [f"{d['op']}: {d['rule']}" for r in records for d in r.details]
    return to_onnx(ir, value_info=True), rules


def run_ort(model: onnx.ModelProto, data_sets: list, rtol: float, atol: float) -> str:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        return "load: " + _first_line(e)
    names = [i.name for i in model.graph.input if not _is_initializer(model, i.name)]
    for inputs, expected in data_sets:
        feed = dict(zip(names, (_feedable(_as_numpy(x)) for x in inputs)))
        expected = [_as_numpy(x) for x in expected]
        try:
            outs = _run_raw(sess, feed)
        except Exception as e:  # noqa: BLE001
            return "run: " + _first_line(e)
        try:
            assert_similar(expected, outs, rtol, atol)
        except (AssertionError, TypeError, ValueError) as e:
            return "mismatch: " + _first_line(e)
    return "pass"


def _as_numpy(x: Any) -> Any:
    """Test data comes as numpy arrays, numpy scalars, TensorProtos or lists of those."""
    if isinstance(x, onnx.TensorProto):
        from onnx import numpy_helper

        return numpy_helper.to_array(x)
    if isinstance(x, np.generic):
        return np.asarray(x)
    if isinstance(x, (list, tuple)):
        return [_as_numpy(v) for v in x]
    return x


def _feedable(x: Any) -> Any:
    """onnxruntime's Python API cannot take ml_dtypes arrays (float8, bfloat16): pass their bits."""
    import onnxruntime as ort

    if isinstance(x, np.ndarray) and x.dtype.type.__module__.startswith("ml_dtypes") and x.dtype.itemsize in (1, 2):
        try:
            onnx_type = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
        except (KeyError, ValueError):
            return x
        bits = x.view(np.uint8 if x.dtype.itemsize == 1 else np.uint16)
        if onnx.TensorProto.DataType.Name(onnx_type) in ("INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1"):
            return x  # sub-byte types: numpy holds one per byte, onnxruntime wants them packed
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, onnx_type)
    return x


def _run_raw(sess, feed: dict) -> list:  # noqa: ANN001
    """sess.run, except that tensors of types numpy lacks (bfloat16, float8) come back as their
    bits viewed as the ml_dtypes type (onnxruntime's Python API cannot convert them)."""
    try:
        return sess.run(None, feed)
    except Exception as e:
        if "Numpy type" not in str(e):
            raise
    import ctypes

    import ml_dtypes
    import onnxruntime as ort

    feed = {k: ort.OrtValue.ortvalue_from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in feed.items()}
    kinds = {"tensor(bfloat16)": ml_dtypes.bfloat16, "tensor(float8e4m3fn)": ml_dtypes.float8_e4m3fn,
             "tensor(float8e4m3fnuz)": ml_dtypes.float8_e4m3fnuz, "tensor(float8e5m2)": ml_dtypes.float8_e5m2,
             "tensor(float8e5m2fnuz)": ml_dtypes.float8_e5m2fnuz}
    outs = []
    for ov in sess.run_with_ort_values(None, feed):
        dt = kinds.get(ov.data_type()) if ov.is_tensor() else None
        if dt is None:
            outs.append(ov.numpy())
            continue
        shape = ov.shape()
        n = int(np.prod(shape)) if shape else 1
        raw = ctypes.string_at(ov.data_ptr(), n * np.dtype(dt).itemsize) if n else b""
        outs.append(np.frombuffer(raw, dtype=dt).reshape(shape).copy())
    return outs


def _is_initializer(model: onnx.ModelProto, name: str) -> bool:
    return any(t.name == name for t in model.graph.initializer)


def assert_similar(ref: list, out: list, rtol: float, atol: float) -> None:
    """onnx's backend-test comparison (onnx.backend.test.runner.Runner.assert_similar_outputs)."""
    if len(ref) != len(out):
        raise AssertionError(f"{len(out)} outputs, expected {len(ref)}")
    for r, o in zip(ref, out):
        if isinstance(r, (list, tuple)):
            if not isinstance(o, (list, tuple)):
                raise AssertionError(f"got {type(o).__name__}, expected a sequence")
            assert_similar(list(r), list(o), rtol, atol)
            continue
        if r is None or o is None:
            if (r is None) != (o is None):
                raise AssertionError("optional output presence differs")
            continue
        o = np.asarray(o)
        if o.dtype != r.dtype and o.dtype.kind == "u" and o.dtype.itemsize == r.dtype.itemsize \
                and r.dtype.type.__module__.startswith("ml_dtypes"):
            o = o.view(r.dtype)  # onnxruntime returns float8 outputs as their uint8 bits
        np.testing.assert_array_equal(o.shape, r.shape, err_msg="shape differs")
        if r.dtype == object:
            np.testing.assert_array_equal(o, r)
            continue
        np.testing.assert_equal(o.dtype, r.dtype)
        tol = rtol
        if o.dtype.name == "bfloat16":
            tol = max(rtol, 2**-6)
        if o.dtype.type.__module__.startswith("ml_dtypes"):
            # numpy cannot promote these with a Python float (np.isclose needs to): compare as
            # float32, which holds every value of these types exactly.
            o, r = o.astype(np.float32), r.astype(np.float32)
        np.testing.assert_allclose(o, r, rtol=tol, atol=atol)


def run_case(case: Any, workdir: Path) -> CaseResult:
    direct = run_ort(case.model, case.data_sets, case.rtol, case.atol)
    try:
        rt_model = roundtrip_proto(case.model, workdir)
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        rt = f"convert: {type(e).__name__}: {_first_line(e)}"
    else:
        rt = run_ort(rt_model, case.data_sets, case.rtol, case.atol)
    rules = None
    try:
        leg_model, rules = legalized_proto(case.model, workdir)
    except Exception as e:  # noqa: BLE001
        leg = f"convert: {type(e).__name__}: {_first_line(e)}"
    else:
        leg = run_ort(leg_model, case.data_sets, case.rtol, case.atol)
    return CaseResult(case.name, direct, rt, leg, rules)


def run_all(cases: list[Any]) -> list[CaseResult]:
    with tempfile.TemporaryDirectory(prefix="mcp-conformance-") as d:
        return [run_case(c, Path(d)) for c in cases]


def summarize(results: list[CaseResult]) -> dict[str, Any]:
    regressions = [r.name for r in results if r.direct == "pass" and r.roundtrip != "pass"]
    leg_regressions = [r.name for r in results if r.direct == "pass" and r.legalized != "pass"]
    gains = [r.name for r in results if r.direct != "pass" and r.roundtrip == "pass"]
    leg_gains = [r.name for r in results if r.direct != "pass" and r.legalized == "pass"]
    kinds = Counter(r.direct.split(":")[0] for r in results)
    return {
        "cases": len(results),
        "ort_direct_pass": sum(r.direct == "pass" for r in results),
        "roundtrip_pass": sum(r.roundtrip == "pass" for r in results),
        "legalized_pass": sum(r.legalized == "pass" for r in results),
        "direct_outcomes": dict(sorted(kinds.items())),
        "regressions": regressions,
        "legalized_regressions": leg_regressions,
        "roundtrip_only_pass": gains,
        "legalized_only_pass": leg_gains,
    }


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--filter", help="only cases whose name contains this")
    ap.add_argument("--json", type=Path, help="write per-case results and the summary here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results = run_all(collect_cases(args.filter))
    summary = summarize(results)
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    for r in results:
        if r.name in summary["regressions"]:
            print(f"REGRESSION {r.name}: {r.roundtrip}")
        if r.name in summary["legalized_regressions"]:
            print(f"REGRESSION (legalized) {r.name}: {r.legalized}")
        if r.name in summary["legalized_only_pass"]:
            print(f"ONLY MCP-CLI {r.name}: {'; '.join(r.rules or [])}")
    print(f"cases: {summary['cases']}  ort-direct pass: {summary['ort_direct_pass']}  "
          f"round-trip pass: {summary['roundtrip_pass']}  "
          f"with legalization: {summary['legalized_pass']}  "
          f"passing directly but not through mcp-cli: "
          f"{len(set(summary['regressions']) | set(summary['legalized_regressions']))}  "
          f"({summary['seconds']} s)")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "cases": [asdict(r) for r in results]},
                                        indent=1))
    return 1 if summary["regressions"] or summary["legalized_regressions"] else 0


if __name__ == "__main__":
    sys.exit(main())
