"""`deploy --kserve --check-image-runtime`: the entry run by the server image's runtime, measured
against the runtime it was verified with.

The Dockerfile's image is Triton's with the python runtime's packages at releases that have a
wheel for that image's Python (kserve.RUNTIME_PINS): onnxruntime 1.23.2 for Triton 24.10's Python
3.10, while entries are verified here on this machine's onnxruntime. Two releases can compute a
model differently (a QDQ tagger: max abs 0.67 between 1.23 and 1.32), so the check installs the
image's pins in a virtual environment of its own (cached under ~/.cache/mcp-cli/image-runtime,
made once), runs the entry's own bundled runtime in it and here on the same samples, as the
server's model.py builds it (the config's execution and session settings), and judges the
difference by the budget any other execution of the same entry is held to.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mcp_compiler.errors import ServerError, UsageError, VerificationError
from mcp_compiler.profile import _budget_text

from .runtime import params as P

SAMPLES = 8
INSTALL_TIMEOUT_S, RUN_TIMEOUT_S = 900, 900

# Run by both interpreters: the entry's runtime (its version folder first on sys.path), built as
# model.py's initialize builds it, on the samples in IN; the outputs to OUT.
_RUNNER = r"""
import json, sys
import numpy as np
vdir, params_json, src, dst = sys.argv[1:5]
sys.path.insert(0, vdir)
import onnxruntime
from mcp_runtime import MCPIRModel, execution
from mcp_runtime.params import read
p = read(json.loads(open(params_json, encoding="utf-8").read()))
how = execution(p.execution, p.precision)
if how.get("engine") == "openvino":
    sys.exit("an OpenVINO execution: the check runs onnxruntime entries")
m = MCPIRModel(vdir + "/" + p.runtime, intra_op_threads=p.intra_op_threads or None, prepack=p.prepack,
               dequantize_at_load=p.dequantize_at_load, **how)
out = {}
with np.load(src, allow_pickle=False) as z:
    n = len({k.split("/", 1)[0] for k in z.files})
    for s in range(n):
        feeds = {k.split("/", 1)[1]: z[k] for k in z.files if k.split("/", 1)[0] == str(s)}
        for j, o in enumerate(m.run(feeds)):
            out[f"{s}/{j}"] = np.asarray(o)
np.savez(dst, **out)
print(json.dumps({"onnxruntime": onnxruntime.__version__, "numpy": np.__version__}))
"""


@dataclass
class ImageCheck:
    image: str
    image_versions: dict[str, str]       # what the image's packages are (reported by its venv)
    verified_versions: dict[str, str]    # this machine's (what the entry was verified on)
    samples: int
    budget: dict[str, float]
    accuracy: dict[str, float] = field(default_factory=dict)   # the worst output: cos, rel, max_abs
    ok: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        a = self.accuracy
        return (f"the image's onnxruntime {self.image_versions['onnxruntime']} against the verified "
                f"{self.verified_versions['onnxruntime']} on {self.samples} samples: cosine {a['cos']:.7f}, "
                f"relative error {a['rel']:.3g}, max abs {a['max_abs']:.3g} "
                f"({'within' if self.ok else 'outside'} {_budget_text(self.budget)})")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mcp-cli" / "image-runtime"


def venv_for(pins: dict[str, str], say: Callable[[str], None] = lambda _: None) -> Path:
    """A virtual environment of this Python with exactly `pins` installed (binary wheels from the
    package index), made once in the cache: built in a folder beside it and renamed in place, so a
    failed or interrupted install never leaves one that looks complete."""
    spec = sorted(f"{k}=={v}" for k, v in pins.items())
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}-" + hashlib.sha256(
        " ".join(spec).encode()).hexdigest()[:12]
    root = cache_root()
    final = root / tag
    if (final / "complete").is_file():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{tag}-", dir=root))
    except OSError as e:
        raise UsageError(f"--check-image-runtime: cannot write its cache {root}: {e.strerror or e}") from None
    try:
        say(f"installing the image's runtime ({', '.join(spec)}) in {final} (once)")
        _run([sys.executable, "-m", "venv", str(work)], "making its virtual environment", 300)
        _run([str(work / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--only-binary=:all:", *spec], "installing " + ", ".join(spec), INSTALL_TIMEOUT_S)
        (work / "complete").write_text("\n".join(spec) + "\n", encoding="utf-8")
        if final.exists():   # a half-made one of an older run (no "complete"): replaced
            shutil.rmtree(final, ignore_errors=True)
        os.replace(work, final)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return final


def _run(cmd: list[str], what: str, timeout: float) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ServerError(f"--check-image-runtime: {what} took over {timeout:g} s") from None
    if r.returncode != 0:
        last = next((ln.strip() for ln in reversed(r.stderr.splitlines()) if ln.strip()), "no output")
        raise ServerError(f"--check-image-runtime: {what} failed: {last[:300]}")
    return r.stdout


def samples(entry: Any, n: int = SAMPLES) -> list[dict[str, np.ndarray]]:   # an entry.Entry
    """`n` requests the entry's model accepts, as the model takes them (random draws at the sizes
    its contracts allow, probed on it here; batch 1 where it batches)."""
    from mcp_compiler.inputs import make, plan, probe

    from .lifecycle import local_model

    model, run = local_model(entry)
    p = probe(model, plan(model, None, fold=False), run)
    batch = 1 if entry.config.max_batch_size > 0 else None
    return [make(model, p, np.random.default_rng(k), batch=batch) for k in range(n)]


def check(entry: Any, pins: dict[str, str], image: str, say: Callable[[str], None] = lambda _: None) -> ImageCheck:
    """Run the entry (an entry.Entry of the python backend) under `pins` and here; raises
    VerificationError outside the budget (ServerError where the image's runtime cannot be made)."""
    from mcp_compiler import profile as prof

    from .entry import execution_of

    cfg = entry.config
    if (cfg.backend or cfg.platform) != "python":
        raise UsageError("--check-image-runtime: the entry is not a python-backend one (Triton's own "
                         "backend runs it in the stock image: nothing of ours to check)")
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    if params.get(P.GENERATION):
        raise UsageError("--check-image-runtime: an LLM (generation) entry is not checked this way; "
                         "`mcp-cli generate` in the image compares its tokens")
    execution = execution_of(cfg)
    if execution != "onnxruntime":
        raise UsageError(f"--check-image-runtime: the entry runs on {execution}; the check compares "
                         "onnxruntime releases")
    venv = venv_for(pins, say)
    feeds = samples(entry)
    say(f"running {cfg.name} on {len(feeds)} samples in the image's runtime and in the verified one")
    with tempfile.TemporaryDirectory(prefix="mcp-image-check-") as tmp:
        t = Path(tmp)
        (t / "params.json").write_text(json.dumps(params), encoding="utf-8")
        np.savez(t / "in.npz", **{f"{s}/{k}": v for s, f in enumerate(feeds) for k, v in f.items()})
        got = {}
        for who, python in (("image", venv / "bin" / "python"), ("here", Path(sys.executable))):
            out = _run([str(python), "-c", _RUNNER, str(entry.local), str(t / "params.json"), str(t / "in.npz"),
                        str(t / f"{who}.npz")], f"running the entry ({who})", RUN_TIMEOUT_S)
            versions = json.loads(out.strip().splitlines()[-1])
            with np.load(t / f"{who}.npz", allow_pickle=False) as z:
                outs = [[z[f"{s}/{j}"] for j in range(sum(1 for k in z.files if k.startswith(f"{s}/")))]
                        for s in range(len(feeds))]
            got[who] = (versions, outs)
    budget = prof.budget_for("f32")   # as any other execution of the same entry is held
    acc = prof._accuracy(got["here"][1], got["image"][1])
    c = ImageCheck(image, got["image"][0], got["here"][0], len(feeds), budget, acc, prof._within(acc, budget))
    if not c.ok:
        raise VerificationError(f"{cfg.name}: {c.line()}: the image computes this entry otherwise than it was "
                                "verified; serve it from an image of the verified onnxruntime, or deploy "
                                "without --check-image-runtime to write the manifests anyway")
    return c
