"""Repository verification: the original ONNX in onnxruntime vs the emitted entry through its own serving runtime."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path

from mcp_compiler.errors import InvalidModelError, UsageError
from mcp_compiler.reference import VerifyReport, compare_with_original, session_options

from .runtime import params as P

_counter = itertools.count()


def load_runtime(version_dir: Path):  # noqa: ANN201 - the bundled mcp_runtime module
    """Import the mcp_runtime package a repository carries (not mcp-cli's own copy)."""
    pkg = version_dir / "mcp_runtime"
    if not (pkg / "__init__.py").exists():
        raise InvalidModelError(version_dir, "no mcp_runtime package in the version folder")
    name = f"_mcp_runtime_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _latest_version(model_dir: Path) -> Path:
    from .entry import version_dirs

    versions = version_dirs(model_dir)
    if not versions:
        raise InvalidModelError(model_dir, "no version folder (e.g. 1/) in the model repository entry")
    return versions[-1][1]


def verify(input: str | os.PathLike, repository: str | os.PathLike, *, samples: int | None = None,
           dims: dict[str, int] | None = None, rtol: float = 1e-3, atol: float = 1e-4,
           seed: int | None = None, inputs: str | os.PathLike | None = None,
           budget: dict[str, float] | None = None) -> VerifyReport:
    """Compare the repository entry's outputs with onnxruntime on `input`.

    `repository` is DIR/NAME. The inputs are the user's (`inputs`: an .npz or a folder of them)
    or made by mcp_compiler.inputs from the model's contracts (`dims` fixes symbol sizes),
    probed on the original first. A quantized entry (its config's quantization_level) is judged
    by `budget` (default: the one it was built with, recorded as `mcp_budget`, else its level's,
    accuracy.DEFAULT_BUDGETS) on 16 samples unless `samples` says otherwise, drawn apart from the
    samples that chose its layers (accuracy.JUDGE_SEED); an entry served at another precision
    (OpenVINO bf16) by the budget its choice recorded; a float one by rtol/atol on 1 sample, run
    with the execution it is served with (onnxruntime or OpenVINO).
    """
    from mcp_compiler.accuracy import JUDGE_SEED, SAMPLES, default_budget
    from mcp_compiler.files import check_regular_input

    from .entry import read_config

    check_regular_input(input)
    model_dir = Path(repository)
    cfg = read_config(model_dir, missing=f"--repository {model_dir}: no config.pbtxt (expected DIR/NAME)")
    from mcp_compiler.llm.gguf_file import is_gguf_file

    gguf = is_gguf_file(input)   # (its decoder is built by mcp-cli: no interface of its own to compare)
    # a generation entry's interface is text in and out, not the decoder's
    outputs = [] if gguf or P.GENERATION in cfg.parameters else _check_same_interface(Path(input), cfg, model_dir)
    vdir = _latest_version(model_dir)
    if gguf or _decoder_entry(cfg):
        from mcp_compiler.llm.verify import verify_llm

        return verify_llm(input, vdir / "model.mcpir", load_runtime(vdir), repository=str(model_dir),
                          **({"prompts": samples} if samples else {}))
    backend = cfg.backend or "onnxruntime"
    level = cfg.parameters[P.QUANTIZATION_LEVEL].string_value if P.QUANTIZATION_LEVEL in cfg.parameters else "none"
    if level == "int8" and inputs is None:
        raise UsageError(f"{model_dir}: an int8 entry is judged on real inputs: give --inputs DIR (samples that "
                         "neither calibrated nor selected it; drawn inputs judge nothing real)")
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    recorded = {} if budget is not None else _recorded_budget(params, model_dir)
    execution = (params.get(P.EXECUTION, "onnxruntime"), params.get(P.PRECISION, "f32"))
    judged = budget or recorded or default_budget(level)
    seed = seed if seed is not None else (JUDGE_SEED if judged else 0)
    report = VerifyReport(str(model_dir), backend, samples or (SAMPLES if judged else 1), dict(dims or {}), rtol, atol)
    report.quantization_level = level
    report.budget = dict(judged)
    report.atol_equal = budget is None and level == "none" and execution != ("onnxruntime", "f32")
    # the interface's layout contract: NHWC values are the NCHW original's, transposed
    report.layouts = _param_json(cfg, P.LAYOUTS, model_dir, dict) if P.LAYOUTS in cfg.parameters else {}
    dequantize = (P.DEQUANTIZE_AT_LOAD in cfg.parameters
                  and cfg.parameters[P.DEQUANTIZE_AT_LOAD].string_value.lower() == "true")
    report.execution = "/".join(execution)
    seen: list[list[tuple]] = []   # the shapes the served model returned, per run

    def emitted(pin: bool = False):  # noqa: ANN202 - feeds -> outputs
        run = _emitted_runner(backend, vdir, pin, dequantize, execution)

        def recorded(feeds: dict) -> list:
            outs = run(feeds)
            seen.append([tuple(getattr(o, "shape", ())) for o in outs])
            return outs
        return recorded

    report = compare_with_original(input, emitted, report, seed=seed, inputs=inputs)
    report.warnings += declared_shape_mismatches(cfg, outputs, seen)
    if P.STATE in cfg.parameters:
        _verify_sequence(Path(input), vdir, cfg, report, execution)
    return report


SEQUENCE_STEPS = 3


def _decoder_entry(cfg) -> bool:  # noqa: ANN001 - ModelConfig
    """A decoder LLM's entry: a generation entry, or its raw step (token ids and a KV cache in:
    mcp_compiler.llm.spec's names)."""
    names = {i.name for i in cfg.input}
    return P.GENERATION in cfg.parameters or ("input_ids" in names and "past_key_values.0.key" in names)


def _verify_sequence(original: Path, vdir: Path, cfg, report: VerifyReport,  # noqa: ANN001 - ModelConfig
                     execution: tuple[str, str] = ("onnxruntime", "f32")) -> None:
    """A stateful entry: SEQUENCE_STEPS requests of one sequence through the runtime's state table
    (only the non-state inputs, as a client sends them), on the execution the entry is served with
    (an OpenVINO entry's through OpenVINO, not onnxruntime), against onnxruntime on the original
    with the state threaded by hand, step by step; judged as the single requests are (the
    tolerances, or the budget of the execution); a mismatch fails the output in the report."""
    import numpy as np

    from mcp_compiler.frontend import load_onnx
    from mcp_compiler.reference import OutputCheck, _row_ok, compare, open_original, sample_inputs

    pairs = state_pairs(cfg, vdir.parent)
    states = {p["input"] for p in pairs}
    sess = open_original(original)[0]
    names = [o.name for o in sess.get_outputs()]
    model = load_onnx(original, check=False, infer_shapes=False).model
    feeds, _ = sample_inputs(model, report.dims, SEQUENCE_STEPS, run=lambda f: sess.run(None, f))
    rt = load_runtime(vdir)
    how = recorded_execution(rt, vdir, execution)
    if how.get("engine") == "openvino":
        how["cache_dir"] = rt.cache_dir_for(vdir / "model.mcpir")
    served = _runtime_model(rt, vdir, options=session_options(), prepack=False, **how)
    table = rt.SequenceState(pairs)
    outs = [o.name for o in cfg.output]
    state = {p["input"]: np.zeros(p["shape"], np.dtype(p["dtype"])) for p in pairs}
    worst: dict[str, list] = {}
    for k, f in enumerate(feeds):
        want = dict(zip(names, sess.run(None, {**{n: a for n, a in f.items() if n not in states}, **state})))
        got = table.step(served.run, {n: a for n, a in f.items() if n not in states}, outs, 1, k == 0,
                         k == len(feeds) - 1)
        for n, g in zip(outs, got):
            worst.setdefault(n, []).append(compare(want[n], g, report.rtol, report.atol))
        state = {p["input"]: want[p["output"]] for p in pairs}
    report.sequence = {"steps": len(feeds), "state": [f"{p['input']}->{p['output']}" for p in pairs],
                       "execution": "/".join(execution)}
    for n, rows in worst.items():
        report.outputs.append(OutputCheck(f"{n} (sequence of {len(feeds)} steps, state on the server)",
                                          max(r[0] for r in rows), max(r[1] for r in rows), min(r[2] for r in rows),
                                          all(_row_ok(report, r) for r in rows), rel_error=max(r[6] for r in rows)))


def declared_shape_mismatches(cfg, names: list[str], seen: list[list[tuple]]) -> list[str]:  # noqa: ANN001 - ModelConfig
    """Outputs whose declared dims (batch first where the config batches; -1 any size; a
    `reshape` is what the model gives) do not fit what the model returned: clients and Triton are
    told a wrong shape. `names`: the model's outputs in the order the runs returned them."""
    batch = [-1] if cfg.max_batch_size > 0 else []
    declared = {o.name: batch + (list(o.reshape.shape) if o.HasField("reshape") else list(o.dims)) for o in cfg.output}
    scalars = set(P.of_config(cfg).scalars) if P.SCALARS in cfg.parameters else set()
    out = []
    for k, name in enumerate(names):
        if name not in declared or name in scalars:   # a scalar is served as [1] by the runtime itself
            continue
        dims = declared[name]
        for shape in sorted({run[k] for run in seen if k < len(run)}):
            if len(shape) != len(dims) or any(d != -1 and d != n for d, n in zip(dims, shape)):
                out.append(f"output {name!r}: the config declares dims {dims} but the model returns shape "
                           f"{list(shape)} (clients and Triton are told a wrong shape)")
                break
    return out


def _check_same_interface(original: Path, cfg, entry: Path) -> list[str]:  # noqa: ANN001 - ModelConfig
    """MODEL and ENTRY must have the same inputs and outputs: an entry converted from another
    model is a usage error naming what differs, not a failed run. The model's outputs, in its
    order ([] where it is not readable here)."""
    import onnx

    try:
        g = onnx.load(str(original), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - not readable here: compare_with_original says why, in its own words
        return []
    weights = {t.name for t in g.initializer}
    want = [i.name for i in g.input if i.name not in weights]
    outs = [o.name for o in g.output]
    have, served = [i.name for i in cfg.input], [o.name for o in cfg.output]
    if P.STATE in cfg.parameters:   # a stateful entry keeps its state inputs and outputs on the server
        pairs = state_pairs(cfg, entry)
        have += [p["input"] for p in pairs]
        served += [p["output"] for p in pairs]
    problems = []
    if missing := [n for n in want if n not in have]:
        problems.append(f"the entry lacks input(s) {', '.join(map(repr, missing))}")
    if extra := [n for n in have if n not in want and n not in weights]:
        problems.append(f"the entry has input(s) {', '.join(map(repr, extra))} the model does not")
    if absent := [n for n in outs if n not in served]:
        problems.append(f"the entry lacks output(s) {', '.join(map(repr, absent))}")
    if unknown := [n for n in served if n not in outs]:
        problems.append(f"the entry has output(s) {', '.join(map(repr, unknown))} the model does not")
    if problems:
        raise UsageError(f"{original} and {entry} do not match: {'; '.join(problems)} "
                         "(was the entry converted from another model?)")
    return outs


BUDGET_TEXT_LIMIT = 4096   # a recorded budget is a few keys: a longer one is not mcp-cli's


def _recorded_budget(params: dict[str, str], entry: Path, given: bool = False) -> dict[str, float]:
    """The budget the entry was built with (`mcp_budget`: --accuracy-budget, or the one its
    execution was chosen by), {} when none. The file is not trusted more than the command line:
    the same rules as --accuracy-budget (known keys, finite numbers in their ranges, a bounded
    parse), and never looser than the default budget of the entry's precision unless the user
    gives that budget to verify (`given`); a bad one is exit 2 naming config.pbtxt."""
    import math

    from mcp_compiler.accuracy import BUDGET_KEYS, BUDGET_RANGES, default_budget

    text = params.get(P.BUDGET)
    if not text:
        return {}
    path = entry / "config.pbtxt"

    def bad(why: str) -> InvalidModelError:
        return InvalidModelError(path, f"parameter mcp_budget {why}")

    if len(text) > BUDGET_TEXT_LIMIT:
        raise bad(f"is {len(text):,} characters: not a budget (at most {BUDGET_TEXT_LIMIT})")

    def no_constant(name: str) -> float:
        raise ValueError(name)

    try:
        got = json.loads(text, parse_constant=no_constant)   # NaN, Infinity: refused
    except (ValueError, RecursionError):
        raise bad(f"is not a budget: {text[:80]!r}") from None
    if not isinstance(got, dict) or not got:
        raise bad(f"is not a budget: {text[:80]!r}")
    out: dict[str, float] = {}
    for k, v in got.items():
        if k not in BUDGET_KEYS:
            raise bad(f"has an unknown key {str(k)[:40]!r} (known: {', '.join(BUDGET_KEYS)})")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise bad(f"{k} = {str(v)[:40]!r} is not a finite number")
        lo, hi = BUDGET_RANGES[k]
        if not lo <= v <= hi:
            raise bad(f"{k} = {v:g} is outside {lo:g}..{hi:g}")
        out[k] = float(v)
    level = params.get(P.QUANTIZATION_LEVEL, "none")
    precision = params.get(P.PRECISION, "f32")
    floor = default_budget(level if level != "none" else precision if precision in ("bf16", "fp16") else None)
    looser = [f"{k} {out[k]:g} (default {floor[k]:g})" for k in out if k in floor and
              (out[k] < floor[k] if BUDGET_KEYS[k][1] == "min" else out[k] > floor[k])]
    if looser and not given:
        flags = ",".join(f"{k}={v:g}" for k, v in out.items())
        raise bad(f"is looser than the default for {level if level != 'none' else precision} ({'; '.join(looser)}): "
                  f"verify judges by a looser budget only when told so: --accuracy-budget {flags}")
    return out


def recorded_execution(rt, vdir: Path, execution: tuple[str, str]) -> dict:  # noqa: ANN001 - the entry's mcp_runtime
    """The runtime's keyword arguments for the execution the entry's config records; one it does
    not know is exit 2 naming the config, before anything runs or starts."""
    try:
        return rt.execution(*execution)
    except rt.MCPIRError as e:
        raise InvalidModelError(vdir.parent / "config.pbtxt", str(e)) from None


def _param_json(cfg, key: str, model_dir: Path, kind: type):  # noqa: ANN001, ANN202 - a ModelConfig; the value
    """A JSON parameter of the entry's config, parsed bounded: a bad one is exit 2 naming the file."""
    from mcp_compiler.files import parse_json

    try:
        return parse_json(cfg.parameters[key].string_value, f"parameter {key}", kind=kind)
    except UsageError as e:
        raise InvalidModelError(Path(model_dir) / "config.pbtxt", str(e)) from None


def state_pairs(cfg, model_dir: Path) -> list[dict]:  # noqa: ANN001 - a ModelConfig
    """The entry's state pairs (mcp_state: [{"input": IN, "output": OUT}, ...]), checked."""
    pairs = _param_json(cfg, P.STATE, model_dir, list)
    if not all(isinstance(p, dict) and isinstance(p.get("input"), str) and isinstance(p.get("output"), str)
               for p in pairs):
        raise InvalidModelError(Path(model_dir) / "config.pbtxt",
                                'parameter mcp_state: not a list of {"input": NAME, "output": NAME}')
    return pairs


def execution_loader(vdir: Path):  # noqa: ANN201 - profile.Loader
    """For mcp_compiler.profile: a candidate execution -> the entry's model run that way by the
    runtime the entry carries, as the server runs it (feeds -> outputs)."""
    rt = load_runtime(vdir)

    def load(c):  # noqa: ANN001, ANN202 - a profile.Candidate
        kw = rt.execution(c.runtime, c.precision)
        if c.runtime.startswith("onnxruntime"):
            # The candidates run in turns in one process: onnxruntime's threads spin for a while
            # after a run (as they may in a server, where nothing else runs) and took the cores
            # from the next candidate here (OpenVINO after onnxruntime: 2.6 -> 3.6 ms on ppocr_cls;
            # onnxruntime's own time unchanged without the spinning).
            from mcp_compiler.session import quiet_options

            kw["options"] = so = quiet_options()   # prepacked, as served
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        model = rt.MCPIRModel(vdir / "model.mcpir", **kw)
        within = getattr(model, "run_within", None)   # (an entry of an older runtime: unbounded)

        def run(feeds: dict) -> list:
            return model.run(feeds)

        def bounded(feeds: dict, seconds: float) -> list:
            try:
                return within(feeds, seconds)
            except rt.RunTimeout as e:
                raise TimeoutError(str(e)) from None

        if within is not None:
            run.within = bounded   # profile.bounded looks for it
        return run
    return load


def _runtime_model(rt, vdir: Path, **kw):  # noqa: ANN001, ANN202 - the entry's mcp_runtime; its MCPIRModel
    """The entry's model in its own runtime; a corrupt or truncated .mcpir (the runtime's
    MCPIRError, which names the file) is the input error it is, exit 2, never an internal one."""
    try:
        return rt.MCPIRModel(vdir / "model.mcpir", **kw)
    except rt.MCPIRError as e:
        raise InvalidModelError(None, str(e)) from None


def _emitted_runner(backend: str, vdir: Path, pin: bool = False,  # noqa: ANN202 - feeds -> outputs
                    dequantize_at_load: bool = False, execution: tuple[str, str] = ("onnxruntime", "f32")):
    """The entry's model as its serving runtime runs it; with `pin`, its random nodes seeded as the
    original's are (mcp_compiler.noise: the check only), through the same lowering in-process."""
    if pin and backend == "python":
        from mcp_compiler.mcpir import read_mcpir
        from mcp_compiler.noise import pin_ir
        from mcp_compiler.session import create_session

        model = read_mcpir(vdir / "model.mcpir")
        pin_ir(model)
        sess = create_session(model, session_options(), prepack=False)
        return lambda feeds: sess.run(None, feeds)
    if pin:
        from mcp_compiler.noise import pinned_onnx_session

        sess = pinned_onnx_session(vdir / "model.onnx", session_options())[0]
        if sess is not None:
            return lambda feeds: sess.run(None, feeds)
    if backend == "python":   # as the server runs it: its execution, weights dequantized at load where it says so
        rt = load_runtime(vdir)
        how = recorded_execution(rt, vdir, execution)
        if how.get("engine") == "openvino":
            # what the server runs: the model and compiled blobs its cache holds (checked there)
            how["cache_dir"] = rt.cache_dir_for(vdir / "model.mcpir")
        emitted = _runtime_model(rt, vdir, options=session_options(), prepack=False,
                                 dequantize_at_load=dequantize_at_load, **how)
        return emitted.run
    import onnxruntime as ort

    sess = ort.InferenceSession(str(vdir / "model.onnx"), session_options(), providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


