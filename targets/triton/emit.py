"""Writes a Triton model repository entry: DIR/NAME/config.pbtxt and DIR/NAME/<version>/...

The whole entry is built in a staging folder and moved into place with os.replace, so a failed
or killed convert never leaves a half-written model. The staging folder is a sibling of DIR
(`.DIR.mcp-staging/`), not inside it: Triton tries to load every folder of a repository, hidden
ones too, and a leftover would stop a server from starting. Concurrent converts into one
repository serialize their final swap on a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
from importlib import resources
from pathlib import Path

from mcp_compiler.errors import OutputError, OutputExistsError, UsageError
from mcp_compiler.files import follow_umask, pid_alive, undone_on_hard_exit, write_error
from mcp_compiler.ir import Model
from mcp_compiler.lower import write_onnx
from mcp_compiler.mcpir import write_mcpir

from ..base import EmitResult, Note, TargetOptions
from .config import build_config, check_name, to_pbtxt
from .params import ServingParams
from .runtime import params as P

RUNTIME_PACKAGE = "mcp_runtime"
_RUNTIME_FILES = ("__init__.py", "decoder.py", "engine.py", "lifetime.py", "params.py", "runtime.py", "sequences.py",
                  "telemetry.py",
                  "text.py")


def write_runtime(dest: Path) -> list[Path]:
    """Copy the serving runtime package (runtime, verifier, FlatBuffers code, schema) into dest."""
    pkg = dest / RUNTIME_PACKAGE
    pkg.mkdir(parents=True)
    src = resources.files("mcp_compiler.targets.triton").joinpath("runtime")
    for name in _RUNTIME_FILES:
        (pkg / name).write_bytes(src.joinpath(name).read_bytes())
    schema = resources.files("mcp_compiler.ir_schema")
    for name in ("mcp_ir_generated.py", "mcp_ir.fbs"):
        (pkg / name).write_bytes(schema.joinpath(name).read_bytes())
    verify = resources.files("mcp_compiler.mcpir").joinpath("verify.py")
    (pkg / "verify.py").write_bytes(verify.read_bytes())
    return sorted(pkg.iterdir())


def _record_request(model: Model, cfg, warnings: list) -> None:  # noqa: ANN001 - ModelConfig
    """The request the checks would send (sizes from the model's shape contracts, value domains:
    index ranges, compared values), in the config: `bench NAME --url` and clients that have only
    the server's config send what the model accepts. A model whose inputs cannot be planned gets
    none, and a note says so."""
    import json

    from mcp_compiler.errors import McpError
    from mcp_compiler.inputs import plan

    try:
        request = plan(model, {}, fold=False).request(batch=1 if cfg.max_batch_size > 0 else None)
    except Exception as e:  # noqa: BLE001 - the entry serves all the same: said, not hidden
        why = str(e) if isinstance(e, McpError) else f"{type(e).__name__}: {e}"
        warnings.append(Note(f"no request recorded in the config ({why[:160]}): clients with the config alone "
                             "guess the inputs"))
        return
    served = {i.name for i in cfg.input}   # a stateful entry's state inputs stay on the server
    request = {k: v for k, v in request.items() if k in served}
    scalars = set(json.loads(cfg.parameters[P.SCALARS].string_value)) if P.SCALARS in cfg.parameters else set()
    for name in scalars & set(request):   # served as [1]
        request[name]["shape"] = [1]
    cfg.parameters[P.REQUEST].string_value = json.dumps(request, sort_keys=True)


def emit_repository(model: Model, out_dir: Path, options: TargetOptions, params: ServingParams,
                    version: int = 1) -> EmitResult:
    """Write DIR/NAME. Nothing is created until the config is built; the staged entry is loaded by
    the target's runtime (unless options.load_check is off) and handed to options.check before it
    replaces anything; on any failure no entry, staging folder or new empty DIR is left behind."""
    name = check_name(options.name if options.name is not None else "model")
    backend = params.backend   # checked with the other serving settings (ServingParams.validate)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--output {out_dir} exists and is not a directory")
    final = out_dir / name
    if final.resolve().parent != out_dir.resolve():
        raise UsageError(f"model name {name!r} escapes the repository {out_dir}")
    if final.exists() and not options.force:
        raise OutputExistsError(f"{final} exists; pass --force to replace it")
    cfg, warnings, cfg_files = build_config(model, name, backend, params, options.quantization)
    if P.GENERATION not in cfg.parameters:   # a generation entry's request is text (its config says how)
        _record_request(model, cfg, warnings)
    if options.budget:   # what `mcp-cli verify` judges the entry by later (the budget it was built with)
        import json

        cfg.parameters[P.BUDGET].string_value = json.dumps(options.budget, sort_keys=True)
    made = _make_dirs(out_dir)
    staging = tmp = None
    session_check = None
    profile = None

    def abandon() -> None:   # (a watchdog's hard exit: the except below never runs)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _tidy(staging, made, out_dir)

    try:
        with undone_on_hard_exit(abandon):
            staging, tmp, warn = _stage(out_dir, name)
            warnings += warn
            vdir = tmp / str(version)
            vdir.mkdir()
            if backend == "python":
                if options.load_check:   # onnxruntime builds the session while Python writes the file
                    session_check = _Background(session_check_maker(model))
                write_mcpir(model, vdir / "model.mcpir")
                served = "llm_model.py" if P.GENERATION in cfg.parameters else "model.py"
                model_py = resources.files("mcp_compiler.targets.triton").joinpath("runtime", served)
                (vdir / "model.py").write_bytes(model_py.read_bytes())
                write_runtime(vdir)
            else:
                write_onnx(model, vdir / "model.onnx")
            (tmp / "config.pbtxt").write_text(to_pbtxt(cfg), encoding="utf-8")
            for rel, data in cfg_files.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(data)
            if session_check is not None:
                _check_header(vdir / "model.mcpir")
                _check_ir(model)
                session_check.result()
            elif options.load_check:
                load_check_onnx(vdir)
            if backend == "python" and params.runtime != "onnxruntime":
                # measured after the load check (nothing else runs beside the timing), before the
                # check: verify then runs the entry with the execution chosen
                profile = _choose_execution(model, vdir, cfg, params, warnings, options.inputs)
                (tmp / "config.pbtxt").write_text(to_pbtxt(cfg), encoding="utf-8")
            if options.check is not None:
                options.check(tmp)
            files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            with _locked(out_dir):
                if final.exists() and not options.force:  # another convert got there first
                    raise OutputExistsError(f"{final} exists; pass --force to replace it")
                _swap_in(tmp, final)
    except BaseException as e:
        if session_check is not None and not isinstance(e, KeyboardInterrupt):
            session_check.wait()   # it reads the model: done before the caller goes on
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _tidy(staging, made, out_dir)
        if isinstance(e, OSError):
            raise write_error(final, e) from None
        raise
    _tidy(staging, [], out_dir)
    return EmitResult(final, files, cfg, warnings, runtime_profile=profile)


def _choose_execution(model: Model, vdir: Path, cfg, params: ServingParams, warnings: list,  # noqa: ANN001
                      inputs: str | None = None) -> dict | None:
    """--runtime auto (or openvino with --precision auto): the profile's choice into the config
    (mcp_execution, mcp_precision, and the budget it was judged by, mcp_budget); a fixed
    --runtime openvino --precision P: its budget only. Returns the profile as a dict, or None.
    With `inputs` (the user's --inputs) the winner is judged on those samples too: what --verify
    and `mcp-cli verify` judge the entry on is never left to random draws alone."""
    import json

    from mcp_compiler import profile as prof

    from .verify import execution_loader

    if P.EXECUTION in cfg.parameters:   # fixed by the user: nothing to measure
        budget = prof.budget_for(cfg.parameters[P.PRECISION].string_value)
        cfg.parameters[P.BUDGET].string_value = json.dumps(budget, sort_keys=True)
        return None

    user = None
    if inputs is not None:
        from mcp_compiler.inputs import load_inputs

        user = load_inputs(inputs, model)
    p = prof.choose(model, execution_loader(vdir), runtime=params.runtime, precision=params.precision,
                    seconds=float(params.profile_seconds), dims=dict(params.warmup_dims) or None, user=user)
    c = p.chosen
    if (c.runtime, c.precision) != ("onnxruntime", "f32"):
        cfg.parameters[P.EXECUTION].string_value = c.runtime
        cfg.parameters[P.PRECISION].string_value = c.precision
        cfg.parameters[P.BUDGET].string_value = json.dumps(c.budget, sort_keys=True)
    judged = any(x.judged is not None for x in p.candidates)   # nothing is judged where onnxruntime stays
    warnings.append(Note(f"--runtime {params.runtime}: {c.key} chosen ({_why(p)}; {p.rounds} paired rounds in "
                         f"{p.seconds:.1f} s" + (f", judged on {p.judge_samples} samples the choice never saw"
                                                 + (f", {len(user)} of them --inputs" if user else "") + ")"
                                                 if judged else ")")))
    return p.to_dict()


def _why(p) -> str:  # noqa: ANN001 - profile.Profile
    c = p.chosen
    if c.ratio is not None and (c.runtime, c.precision) != ("onnxruntime", "f32"):
        return f"{1 / c.ratio:.2f}x onnxruntime fp32's speed, paired ratios {c.ratio_spread[0]:.2f}-{c.ratio_spread[1]:.2f}"
    dropped = [f"{x.key} {x.dropped}" for x in p.candidates if x.dropped]
    return "; ".join(p.notes + dropped) or "the only candidate"


def load_check_onnx(vdir: Path) -> None:
    """The onnxruntime backend's load check: the written model.onnx loads in onnxruntime (a
    session made and dropped)."""
    from mcp_compiler.session import load_check_file

    load_check_file(vdir / "model.onnx")


def session_check_maker(model: Model):  # noqa: ANN201 - () -> None
    """The python backend's load check, session half: a model onnxruntime refuses never becomes a
    finished entry. The session is built from the IR just written (the runtime's own lowering of
    the same IR), not by reading the file back (a fifth of the conversion at 50k nodes): lowered
    now, the session made (and checked) when called. The file's header and the IR's order are
    checked beside it; `mcp-cli verify` (and `--verify`) runs the runtime on the file."""
    from mcp_compiler.session import load_check as check
    from mcp_compiler.session import load_check_options, session_maker

    so = load_check_options(optimize=False)
    made = []   # the lowering's own refusals are load-check failures too, as before the split
    check(lambda: made.append(session_maker(model, so, prepack=False)), "the serving runtime")
    return lambda: check(made[0], "the serving runtime")


class _Background:
    """fn() on a thread of its own; result() waits and raises what it raised. onnxruntime
    releases the GIL while it builds a session: at 100k nodes most of the load check then runs
    beside the .mcpir writer (only reads the model, as the writer does)."""

    def __init__(self, fn) -> None:  # noqa: ANN001 - () -> None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to result()
                self.error = e

        self.thread = threading.Thread(target=run, name="mcp-load-check", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        self.thread.join()

    def result(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def _check_ir(model: Model) -> None:
    """What the runtime's reader refuses and onnxruntime does not (it sorts nodes itself): a node
    list out of topological order, a value used before it is defined, a name defined twice."""
    from mcp_compiler.errors import LoadCheckError
    from mcp_compiler.ir.verify import IRVerificationError, verify

    try:
        verify(model)
    except IRVerificationError as e:
        raise LoadCheckError(f"the emitted model does not load in the serving runtime: {e} "
                             "(--no-load-check skips this check)") from None


def _check_header(path: Path) -> None:
    """The file is a whole MCP-IR buffer: our identifier, and a size prefix within its length."""
    from mcp_compiler.errors import LoadCheckError
    from mcp_compiler.mcpir.reader import is_mcpir

    with open(path, "rb") as f:
        head = f.read(12)
        size = f.seek(0, 2)
    if not is_mcpir(head) or 4 + int.from_bytes(head[:4], "little") > size:
        raise LoadCheckError(f"the emitted model does not load in the serving runtime: {path.name} is not a "
                             "whole MCP-IR file (--no-load-check skips this check)")


def install_entry(src: Path, out_dir: Path, name: str) -> Path:
    """Copy a finished entry (e.g. from a cache) into the repository as DIR/NAME, replacing any
    entry there, with the same staging and locking as a convert."""
    final = out_dir / check_name(name)
    made = _make_dirs(out_dir)
    staging = tmp = None
    try:
        staging, tmp, _ = _stage(out_dir, name)
        shutil.copytree(src, tmp, dirs_exist_ok=True, copy_function=shutil.copyfile)
        for d in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
            follow_umask(d, directory=True)  # copytree copied the cache's folder modes
        with _locked(out_dir):
            _swap_in(tmp, final)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _tidy(staging, made, out_dir)
        raise
    _tidy(staging, [], out_dir)
    return final


def _make_dirs(out_dir: Path) -> list[Path]:
    """mkdir -p out_dir; the folders it made, innermost first (to remove them after a failure)."""
    made = []
    p = out_dir.absolute()
    for q in (p, *p.parents):
        if q.is_symlink() and not q.exists():   # mkdir would fail on it (FileExistsError)
            raise UsageError(f"--output {out_dir}: {q} is a link to {os.readlink(q)}, which does not exist")
    while not p.exists():
        made.append(p)
        p = p.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    return made


def _stage(out_dir: Path, name: str) -> tuple[Path, Path, list[str]]:
    """(staging folder, a fresh folder in it for this entry, warnings)."""
    for _ in range(5):
        staging, warn = _staging_dir(out_dir)
        _remove_stale(staging, name)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f"{name}.{os.getpid()}.", suffix=".tmp", dir=staging))
        except FileNotFoundError:  # another convert removed the (then empty) staging folder
            continue
        follow_umask(tmp, directory=True)  # mkdtemp makes 0700: a server running as another user must read it
        return staging, tmp, warn
    raise OutputError(f"cannot make a staging folder beside {out_dir}")


def _tidy(staging: Path | None, made: list[Path], out_dir: Path) -> None:
    """Remove the staging folder when empty, and the repository folders this emit made when a
    failure left them with nothing but the lock file."""
    if staging is not None:
        with contextlib.suppress(OSError):
            staging.rmdir()
    if made and made[0] == out_dir.absolute():
        with contextlib.suppress(OSError):
            (out_dir / ".mcp-cli.lock").unlink()
    for d in made:
        with contextlib.suppress(OSError):
            d.rmdir()


def _staging_dir(out_dir: Path) -> tuple[Path, list[str]]:
    sibling = out_dir.resolve().parent / f".{out_dir.resolve().name}.mcp-staging"
    try:
        sibling.mkdir(exist_ok=True)
        return sibling, []
    except OSError:
        inside = out_dir / ".mcp-staging"
        inside.mkdir(exist_ok=True)
        return inside, [f"cannot write beside {out_dir}; staging inside it ({inside}): a convert "
                        "killed mid-way leaves a folder there that Triton will fail to load"]


def _remove_stale(staging: Path, name: str) -> None:
    """Staging folders of converts that died (their pid is gone)."""
    for p in staging.glob(f"{name}.*.tmp*"):  # and the .old entry a swap had moved aside
        pid = p.name[len(name) + 1:].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            _remove(p)


@contextlib.contextmanager
def _locked(out_dir: Path):  # noqa: ANN202
    fd = os.open(out_dir / ".mcp-cli.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _swap_in(tmp: Path, final: Path) -> None:
    """Replace `final` by `tmp`; an old entry is moved aside first and removed after."""
    old = None
    if final.exists():
        old = tmp.with_name(f"{tmp.name}.old")  # in the staging folder: Triton never sees it
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    if old is not None:
        _remove(old)


def _remove(p: Path) -> None:
    """A folder, or a regular file or link where an entry was (rmtree would leave those)."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
