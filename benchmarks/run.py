"""Every benchmark of the project, side by side with its peers, in one run.

    python benchmarks/run.py            # full runs (medians of >= 5 where cheap), write RESULTS.md
    python benchmarks/run.py --quick    # a smoke run for CI: small sizes, nothing written
    python benchmarks/run.py --only convert,zoo

Each benchmark is its own script (benchmarks/bench_*.py) and writes its own section of
benchmarks/RESULTS.md; this runs them in turn, one at a time (they must not share the CPUs).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = {
    "conformance": ([], []),
    "convert": (["--runs", "5", "--big-mb", "1024"], ["--quick"]),
    "scale": (["--runs", "5"], ["--quick"]),
    "passes": (["--runs", "3"], ["--quick"]),
    "quantize": (["--runs", "3", "--layers", "6"], ["--quick"]),
    "zoo": (["--runs", "5"], ["--quick"]),
    "serving": (["--runs", "3", "--seconds", "6"], ["--quick"]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="comma-separated subset of: " + ", ".join(BENCHES))
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(unknown)}")
    failed = []
    for name in names:
        if args.quick and name == "conformance":
            continue  # the test suite runs the conformance cases already
        full, quick = BENCHES[name]
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        r = subprocess.run([sys.executable, str(HERE / f"bench_{name}.py"), *(quick if args.quick else full)])
        print(f"== {name}: {'ok' if r.returncode == 0 else f'FAILED ({r.returncode})'} "
              f"in {time.perf_counter() - t0:.0f} s", flush=True)
        if r.returncode:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
