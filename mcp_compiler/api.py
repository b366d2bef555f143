"""The library's entry points: what the CLI (and any other caller) uses."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import AccuracyError, InvalidModelError, OutputExistsError, UsageError
from .files import write_error
from .frontend import load_onnx
from .ir.graph import Model
from .ir_schema import FILE_EXTENSION
from .mcpir.writer import write_mcpir
from .options import CompileOptions
from .summary import ModelSummary, summarize

DEFAULT_REPOSITORY = "model_repository"


@dataclass
class CompileReport:
    input: str
    output: str
    nodes: int
    weights: int
    weight_bytes: int
    output_bytes: int
    input_weight_bytes: int = 0     # the input model's weights, before any pass
    target: str | None = None
    files: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # what the user should know that is not a problem
    verification: dict | None = None
    passes: list[dict] = field(default_factory=list)
    quantization: dict | None = None
    runtime_profile: dict | None = None   # --runtime auto: the executions measured, and the choice

    def to_dict(self) -> dict:
        return asdict(self)


def load_model(path: str | os.PathLike, *, check: bool = True, infer_shapes: bool = True,
               last_logits: bool = True) -> tuple[Model, str, list[str]]:
    """Load an ONNX, GGUF or MCP-IR file: (model, format, warnings).

    A file is MCP-IR when it carries the identifier or is named *.mcpir (then a wrong identifier
    is reported as such, rather than as a failed ONNX parse); GGUF by its magic or a *.gguf name
    (its decoder is built: with `last_logits`, logits for one position a row, as a served entry
    wants; without, Optimum's logits for every position).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError as e:
        raise InvalidModelError(path, f"cannot read: {e.strerror}") from None
    from .mcpir.reader import is_mcpir, read_mcpir  # not needed on the ONNX path: imported late

    if is_mcpir(head) or path.suffix == FILE_EXTENSION:
        return read_mcpir(path), "mcpir", []
    from .llm.gguf_file import is_gguf

    if is_gguf(head) or path.suffix == ".gguf":
        from .frontend.gguf import load_gguf

        loaded = load_gguf(path, check=check, infer_shapes=infer_shapes, last_logits=last_logits)
        return loaded.model, "gguf", loaded.warnings
    loaded = load_onnx(path, check=check, infer_shapes=infer_shapes)
    from .llm.spec import mark_layout

    mark_layout(loaded.model)
    return loaded.model, "onnx", loaded.warnings


def compile_model(input: str | os.PathLike, output: str | os.PathLike | None,
                  options: CompileOptions | None = None) -> CompileReport:
    """ONNX (or MCP-IR) -> `.mcpir`, or with a target -> that target's artifacts (a Triton
    repository): load, plan, run the passes, check accuracy, emit (verifying the staged entry).

    Outputs are written atomically: a failure leaves nothing behind.
    """
    options = _output_target(options or CompileOptions(), output).validate()
    target = _target(options)
    output = _check_paths(input, output, options, target)
    clock = _Clock()
    model, fmt, warnings, notes = _load(input, options)
    options = _recorded_settings(model, target, options, input, warnings)
    weights_in, grown_from = _weight_bytes(model)   # what summarize() counts, without its walk; weights proper
    samples = _calibration(model, options)
    checked = _selection_samples(input, fmt, samples, options)
    clock.lap("load")
    model, records, warnings, properties = _run_passes(input, model, target, options, samples, warnings,
                                                       checked[0] if checked else None)
    clock.lap("passes")
    int8 = None
    if _int8_wanted(options, fmt):   # --runtime auto --calibration-data: int8 as a candidate
        (model, records, warnings, properties), options, int8, took = _int8_candidate(
            input, fmt, (model, records, warnings, properties), target, options, samples)
        if took is not None:
            samples, checked = took
        clock.lap("int8")
    report = _report(input, output, model, fmt, warnings, records, options)
    report.input_weight_bytes = weights_in
    report.notes += notes
    if _weight_bytes(model)[1] > grown_from:   # (a folded shape, merged Slice bounds: parameters, not weights)
        report.warnings.append(f"the weights grew from {weights_in} to {report.weight_bytes} bytes "
                               f"({_growth_cause(records)})")
    if options.quantize is not None:
        _check_quantization(input, fmt, model, samples, options, report, checked)
        clock.lap("accuracy")
    _write(model, target, input, output, options, report, properties)
    clock.lap("emit")
    if int8 is not None:
        report.runtime_profile = {**(report.runtime_profile or {}), "int8": int8.to_dict()}
        report.notes.append(int8.summary())
    return _finish(report, clock)


def _int8_wanted(options: CompileOptions, fmt: str) -> bool:
    from .int8_profile import wanted

    return fmt == "onnx" and wanted(options)


def _int8_candidate(input, fmt: str, floated: tuple, target, options: CompileOptions,  # noqa: ANN001
                    samples: list[dict]) -> tuple:   # (passes' result, options, Int8Choice, samples or None)
    """int8 beside the float pipeline's result (`floated`: model, records, warnings, properties),
    measured as mcp_compiler.int8_profile says. Taken: the int8 pipeline's result, the options of
    `--quantize int8`, the choice, and (calibration share, (judging samples, their label)) for
    the accuracy report; not taken: `floated` as it was, the options unchanged, the choice, None."""
    from dataclasses import replace

    from . import int8_profile as i8
    from .accuracy import default_budget
    from .errors import McpError
    from .passes.quantize import QuantizeOptions

    choice = i8.Int8Choice()
    held = None
    if options.checks.inputs is not None:
        from .inputs import load_inputs

        held = load_inputs(options.checks.inputs, floated[0])
    quant, judge = i8.split(samples, held)
    label = (f"{options.checks.inputs} ({len(judge)} samples)" if held is not None else
             f"{options.accuracy.calibration_data} ({len(judge)} samples held out of the quantization: every "
             f"{i8.HOLDOUT_EVERY}rd; --inputs judges on a folder of your own)")
    choice.judged_on, choice.judge_samples, choice.quantize_samples = label, len(judge), len(quant)
    choice.budget = dict(options.accuracy.budget) or default_budget("int8")
    if len(quant) < i8.MIN_QUANTIZE or not judge:
        choice.dropped = (f"needs at least {i8.HOLDOUT_EVERY} calibration samples (2 to quantize, 1 held out to "
                          f"judge), or --inputs; {options.accuracy.calibration_data} has {len(samples)}")
        return floated, options, choice, None
    q_options = replace(options, quantize=QuantizeOptions(mode="int8", search=options.accuracy.auto_exclude is not False))
    try:
        model_q = load_model(input, check=False, infer_shapes=options.checks.infer_shapes)[0]
        got = _run_passes(input, model_q, target, q_options, quant, list(floated[2]))
    except AccuracyError as e:
        choice.dropped = f"no int8 form within its budget: {e}"
        return floated, options, choice, None
    except McpError as e:
        return floated, options, i8.failed(choice, e), None
    choice.int8 = next((r.stats["int8"] for r in got[1] if r.name == "quantize-int8" and "int8" in r.stats), None)
    if not _quantized_any(got[1]):
        choice.dropped = "nothing was quantized to int8 (no Conv, MatMul or Gemm onnxruntime quantizes)"
        return floated, options, choice, None
    reference = input if fmt == "onnx" else load_model(input, check=False, infer_shapes=False)[0]
    if not i8.judge(reference, got[0], judge, label, choice.budget, choice):
        return floated, options, choice, None
    seconds = float(getattr(options.target.params, "profile_seconds", None) or 20)
    i8.time_pair(floated[0], got[0], [*judge, *quant], seconds, choice)
    if not i8.faster(choice):
        return floated, options, choice, None
    choice.chosen = True
    return got, q_options, choice, (quant, (judge, label))


def _weight_bytes(model: Model) -> tuple[int, int]:
    """Bytes of every constant tensor, and of the weights proper: all but the operators' small
    integer parameters (Tensor.is_parameter); one walk."""
    total = proper = 0
    for t in model.tensors():
        total += t.nbytes
        proper += 0 if t.is_parameter else t.nbytes
    return total, proper


def _finish(report: CompileReport, clock: _Clock) -> CompileReport:
    report.seconds = clock.seconds
    if report.verification is not None:   # it ran inside emit (on the staged entry): counted once
        report.seconds["verify"] = report.verification.pop("seconds")
        if "emit" in report.seconds:
            report.seconds["emit"] = round(max(0.0, report.seconds["emit"] - report.seconds["verify"]), 4)
    report.warnings = list(dict.fromkeys(report.warnings))  # shape inference runs twice: say it once
    return report


class _Clock:
    def __init__(self) -> None:
        self.t, self.seconds = time.perf_counter(), {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self.t, 4)
        self.t = now


def _output_target(options: CompileOptions, output) -> CompileOptions:  # noqa: ANN001
    """`-o out.onnx` without --target: the ONNX output (the `onnx` target)."""
    from dataclasses import replace

    from .options import target_for

    name = target_for(options.target.name, output)
    return options if name == options.target.name else replace(options, target=replace(options.target, name=name))


def _target(options: CompileOptions):  # noqa: ANN202 - targets.Target or None
    if options.target.name is None:   # (a target imports onnxruntime: not for a plain .mcpir)
        return None
    from .targets import get_target

    return get_target(options.target.name)


def _load(input, options: CompileOptions) -> tuple[Model, str, list[str], list[str]]:  # noqa: ANN001
    c = options.checks
    model, fmt, warnings = load_model(input, check=c.check, infer_shapes=c.infer_shapes,
                                      last_logits=options.target.name != "onnx")
    notes = []
    if c.verify and fmt not in ("onnx", "gguf"):
        raise UsageError("--verify compares with onnxruntime on the original: give the .onnx model")
    if fmt == "onnx" and c.initializer_inputs == "weights":
        from .frontend.onnx import weights_not_inputs

        taken = weights_not_inputs(model)
        if taken:
            notes.append(f"{len(taken)} initializer(s) listed as graph inputs too ({', '.join(taken[:3])}"
                         f"{', ...' if len(taken) > 3 else ''}) are taken as weights, as onnxruntime's "
                         "optimizers and onnxsim take them (--initializer-inputs inputs keeps them feedable)")
    if c.dims:
        from .reference import check_dims

        check_dims(model, c.dims)
    opset = options.pipeline.opset
    if opset is not None and model.onnx_opset is not None and opset < model.onnx_opset:
        raise UsageError(f"--opset {opset}: the model is at opset {model.onnx_opset}; --opset can only raise it")
    return model, fmt, warnings, notes


def _calibration(model: Model, options: CompileOptions) -> list[dict] | None:
    if options.accuracy.calibration_data is None:
        return None
    from .accuracy import load_samples

    return load_samples(options.accuracy.calibration_data, model)


def _selection_samples(input, fmt: str, samples, options: CompileOptions) -> tuple[list, str] | None:  # noqa: ANN001
    """With --accuracy-budget and layer selection on: the accuracy report's samples, made before
    the passes (the quantize pass selects its layers on them)."""
    if options.quantize is None or not options.accuracy.selects_layers or options.quantize.mode == "int8":
        return None   # (int8 selects on its own share of the calibration samples)
    reference = input if fmt == "onnx" else load_model(input, check=False, infer_shapes=False)[0]
    got = _accuracy_samples(input, reference, samples, options)
    return got if got[0] is not None else None


def _run_passes(input, model: Model, target, options: CompileOptions, samples,  # noqa: ANN001
                warnings: list[str], checked: list | None = None) -> tuple[Model, list, list[str], set]:
    """The pipeline: the model, the pass records, the warnings, the properties it established.
    When it quantized nothing, the opset raised for quantization would be a change for nothing:
    the model is loaded again and run without it."""
    if not options.has_pipeline:
        return model, [], warnings, set()
    records, props = _pipeline(model, target, options, samples, options.quantize, checked)
    if options.quantize is not None and options.pipeline.opset is None and not _quantized_any(records) \
            and any(r.name == "upgrade-opset" and r.modified for r in records):
        model = load_model(input, check=False, infer_shapes=options.checks.infer_shapes)[0]
        records, props = _pipeline(model, target, options, samples, None)
        warnings = [*warnings, "--quantize: nothing to quantize; the model is left at its opset"]
    return model, records, warnings, props


def _pipeline(model: Model, target, options: CompileOptions, samples, quantize,  # noqa: ANN001
              checked: list | None = None) -> tuple[list, set]:
    from . import pipeline

    pm = pipeline.build(target, options.pipeline, quantize=quantize, calibration=samples)
    if checked:
        pm.ctx.budget, pm.ctx.samples = dict(options.accuracy.budget), checked
    elif quantize is not None and quantize.mode == "int8" and options.accuracy.budget:
        pm.ctx.budget = dict(options.accuracy.budget)
    from .passes import WeightGrowth

    pm.instruments.append(WeightGrowth(model))
    return pm.run(model)[1], pm.properties


def _growth_cause(records: list) -> str:
    grew: dict[str, int] = {}
    for r in records:
        if r.stats.get("weight_growth_bytes"):
            grew[r.name] = grew.get(r.name, 0) + r.stats["weight_growth_bytes"]
    if not grew:
        return "constant folding materialized generated tensors: --fold-size-limit"
    top = sorted(grew.items(), key=lambda kv: -kv[1])
    said = ", ".join(f"{n} +{b} bytes" for n, b in top[:3])
    hint = "; --fold-size-limit bounds what folding stores" if any(n == "fold-constants" for n, _ in top) else ""
    return f"grown by {said}{hint}"


def _report(input, output: Path, model: Model, fmt: str, warnings: list[str], records: list,  # noqa: ANN001
            options: CompileOptions) -> CompileReport:
    s = summarize(model, fmt)
    report = CompileReport(input=str(input), output=str(output), nodes=s.nodes, weights=s.weights,
                           weight_bytes=s.weight_bytes, output_bytes=0, target=options.target.name,
                           warnings=[*warnings, *(w for r in records for w in r.warnings)],
                           passes=[asdict(r) for r in records])
    return report


def _check_quantization(input, fmt: str, model: Model, samples, options: CompileOptions,  # noqa: ANN001
                        report: CompileReport, checked: tuple[list, str] | None = None) -> None:
    report.quantization = _quantization_report(options, report.passes, report.input_weight_bytes,
                                               report.weight_bytes)
    if report.quantization["quantized"]:
        _check_accuracy(input, fmt, model, samples, options, report, checked)
    else:
        from collections import Counter

        reasons = Counter(row.get("reason", "?") for row in report.quantization.get("skipped", []))
        why = "; ".join(f"{r} ({k})" for r, k in reasons.most_common(3))
        report.warnings.append(f"--quantize: no weight was quantized{': ' + why if why else ''} "
                               "(the report's quantization.skipped lists each layer)")


TARGET_KEY, SERVING_KEY = "mcp.target", "mcp.serving"   # an .mcpir lowered for a target records them


def _lowered_for(target, output: Path) -> bool:  # noqa: ANN001
    """-o model.mcpir with --target triton-v1.12: the model lowered for it, not its entry."""
    return target is not None and target.output_suffix is None and Path(output).suffix == FILE_EXTENSION


def _recorded_settings(model: Model, target, options: CompileOptions, input, warnings: list) -> CompileOptions:  # noqa: ANN001
    """An .mcpir lowered for a target carries the target and the serving settings it was lowered
    with: converting it for that target takes them, the flags given now winning (a setting left at
    its default takes the recorded one). The keys never reach what is emitted."""
    from dataclasses import fields, replace

    from .files import parse_json

    name, text = model.metadata_props.pop(TARGET_KEY, None), model.metadata_props.pop(SERVING_KEY, None)
    if name is None or target is None or target.output_suffix is not None:
        return options
    if name != target.name:
        warnings.append(f"{input} was lowered for target {name}: its serving settings are not used for {target.name}")
        return options
    recorded = parse_json(text or "{}", f"{input}: its recorded serving settings", limit=1 << 16, kind=dict)
    params = options.target.params
    if params is None:
        from .targets.triton.params import ServingParams

        params = ServingParams()
    default = type(params)()
    given = {f.name: getattr(params, f.name) for f in fields(params) if getattr(params, f.name) != getattr(default, f.name)}
    from .targets.triton.params import resolve

    merged = resolve(recorded, given, f"{input}: its recorded serving settings")
    return replace(options, target=replace(options.target, params=merged))


def _record_settings(model: Model, target, options: CompileOptions) -> None:  # noqa: ANN001
    import json
    from dataclasses import fields

    params = options.target.params
    kept = {}
    if params is not None:
        default = type(params)()
        kept = {f.name: getattr(params, f.name) for f in fields(params)
                if getattr(params, f.name) != getattr(default, f.name)}
    model.metadata_props[TARGET_KEY] = target.name
    model.metadata_props[SERVING_KEY] = json.dumps(kept, sort_keys=True)


def _write(model: Model, target, input, output: Path, options: CompileOptions,  # noqa: ANN001
           report: CompileReport, properties: set) -> None:
    if _lowered_for(target, output):   # the design's `--output model.mcpir --target ...`
        _require_legal(model, target, properties)
        report.warnings += target.check(model)
        _record_settings(model, target, options)
        report.notes.append(f"{output} is lowered for {target.name} (its rewrites applied, the serving settings "
                            f"recorded); its repository entry: mcp-cli convert {output} -t {target.name} "
                            "-o model_repository")
    elif target is not None:
        _require_legal(model, target, properties)
        _emit(model, target, input, output, options, report)
        return
    try:
        stats = write_mcpir(model, output)
    except OSError as e:
        raise write_error(output, e) from None
    report.output_bytes = stats.file_bytes
    report.files = [output.name]


def _check_paths(input, output, options: CompileOptions, target) -> Path:  # noqa: ANN001
    """The output, checked before any work: the right kind, writable, not there without --force."""
    from .files import check_output, check_regular_input

    check_regular_input(input)
    if target is not None and target.output_suffix is None and not _lowered_for(target, output or ""):
        output = Path(DEFAULT_REPOSITORY if output is None else output)
        if output.suffix == ".onnx":
            raise UsageError(f"--output {output}: with --target {target.name}, --output is the model repository "
                             f"folder (the model goes inside it), or a {FILE_EXTENSION} file lowered for it")
        check_output(output, "--output", directory=True)
        _outside_entries(output)
        return output
    if output is None:
        raise UsageError(f"--output is required without --target (a {FILE_EXTENSION} or .onnx file)")
    output = Path(output)
    if _lowered_for(target, output) and options.checks.verify:
        raise UsageError(f"--verify checks the entry a target serves: make it from this file with "
                         f"`mcp-cli convert {output} -t {target.name} -o model_repository`, verified with "
                         f"`mcp-cli verify {input} model_repository/NAME`, or give -o a repository folder")
    want = FILE_EXTENSION if target is None or _lowered_for(target, output) else target.output_suffix
    if output.suffix != want:
        raise UsageError(f"--output {output}: expected a file named *{FILE_EXTENSION} (MCP-IR) or *.onnx (an "
                         "optimized ONNX model); Triton repositories come with --target triton-v1.12")
    check_output(output, "--output", inputs=(input,))
    if output.exists() and not options.target.force:
        raise OutputExistsError(f"{output} exists; pass --force to replace it")
    return output


def _outside_entries(output: Path) -> None:
    """A repository is not written inside a model entry: `-o REPO/NAME` (or its version folder)
    made REPO/NAME/model, a folder Triton ignores and deploy carries along with the entry."""
    p = output.absolute()
    for q in (p, *p.parents[:2]):
        if (q / "config.pbtxt").is_file():
            repo = q.parent
            raise UsageError(f"--output {output}: {q} is a model entry (it holds config.pbtxt), not a model "
                             f"repository; give its repository ({repo}) to write an entry beside it")


def _require_legal(model: Model, target, properties: set) -> None:  # noqa: ANN001
    """Emitting requires target-legal: established by the pipeline's legalize pass, or else
    checked here (a --passes list without it)."""
    from .passes import Property

    if Property.TARGET_LEGAL in properties:
        return
    illegal = target.is_legal(model)
    if illegal:
        from .errors import UnsupportedError

        more = f" and {len(illegal) - 5} more" if len(illegal) > 5 else ""
        raise UnsupportedError(f"target {target.name} cannot run {len(illegal)} node(s): {'; '.join(illegal[:5])}{more}",
                               hint="keep the legalize pass in the pipeline")


def _quantized_any(records: list) -> bool:  # PassRecords
    return any(r.name.startswith("quantize-") and r.modified for r in records)


def _emit(model: Model, target, input, output: Path, options: CompileOptions,  # noqa: ANN001
          report: CompileReport) -> None:
    """The target's entry; the load check and --verify run on the staged entry, so a model that
    fails either never replaces anything."""
    from .targets import TargetOptions

    # --quantize that changed no weight (already uint8, float16 already, ...) makes a float entry:
    # judged as one (one sample, float tolerances), not by a budget on 16 samples and a level it lacks
    quantized = bool(options.quantize and (report.quantization or {}).get("quantized"))

    def verify_staged(entry: Path) -> None:
        from .accuracy import default_budget

        t = time.perf_counter()
        # a quantized model is judged by its accuracy budget (default: its level's), not float32 tolerances
        budget = (options.accuracy.budget or default_budget(options.quantize.mode)) if quantized else None
        v = target.verify(input, entry, dims=options.checks.dims, inputs=options.checks.inputs, budget=budget)
        v.repository = str(where)
        report.verification = {**v.to_dict(), "seconds": round(time.perf_counter() - t, 4)}
        report.warnings.extend(v.warnings)
        v.raise_if_failed()

    report.warnings += target.check(model)
    t = options.target
    name = t.entry if t.entry is not None else target.entry_name(Path(input).stem)
    where = output if target.output_suffix else Path(output) / name
    result = target.emit(model, output, TargetOptions(
        name=name, force=t.force, params=t.params,
        quantization=options.quantize.mode if quantized else "none",
        budget=dict(options.accuracy.budget) if quantized and options.accuracy.budget else None,
        load_check=t.load_check, inputs=options.checks.inputs,
        check=verify_staged if options.checks.verify else None))
    report.output = str(output) if target.output_suffix else str(result.root)
    report.files = result.files
    report.output_bytes = sum((result.root / f).stat().st_size for f in result.files)
    from .targets.base import Note

    report.warnings += [w for w in result.warnings if not isinstance(w, Note)]
    report.notes += [str(w) for w in result.warnings if isinstance(w, Note)]
    report.runtime_profile = result.runtime_profile


def _quantization_report(options: CompileOptions, records: list[dict], before: int, after: int) -> dict:
    rows = [d for r in records if r["name"].startswith("quantize-") for d in r["details"]]
    q = options.quantize
    return {
        "mode": q.mode, "options": asdict(q),
        "quantized": [r for r in rows if r["action"] == "quantized"],
        "skipped": [r for r in rows if r["action"] == "skipped"],
        "weight_bytes_before": before, "weight_bytes_after": after,
        "compression": round(before / after, 3) if after else None,
        "opset": next(({"from": r["stats"]["from"], "to": r["stats"]["to"]} for r in records
                       if r["name"] == "upgrade-opset" and r["modified"]), None),
        "selection": next((r["stats"]["selection"] for r in records
                           if r["name"].startswith("quantize-") and "selection" in r["stats"]), None),
        "int8": next((r["stats"]["int8"] for r in records if r["name"] == "quantize-int8" and "int8" in r["stats"]), None),
    }


def _check_accuracy(input, fmt: str, model: Model, samples, options: CompileOptions,  # noqa: ANN001
                    report: CompileReport, checked: tuple[list, str] | None = None) -> None:
    """Quantized vs onnxruntime on the original, on the calibration samples, the user's inputs or
    random inputs the model accepts; raises AccuracyError (before anything is written) when
    outside the budget."""
    from .accuracy import check_budget, measure, under_default

    reference = input if fmt == "onnx" else load_model(input, check=False, infer_shapes=False)[0]
    samples, label = checked or _accuracy_samples(input, reference, samples, options)
    if samples is None:
        return
    acc = measure(reference, model, samples, label)
    report.quantization["accuracy"] = acc.to_dict()
    if not options.accuracy.budget:
        report.warnings += under_default(acc, options.quantize.mode)
    selection = report.quantization.get("selection")
    try:
        check_budget(acc, options.accuracy.budget)
    except AccuracyError as e:
        if selection:
            kept = selection["kept"]
            raise AccuracyError(f"{e}; {len(kept)} of {selection['layers']} layers kept in float by "
                                f"--auto-exclude ({', '.join(kept[:5])}{' ...' if len(kept) > 5 else ''})") from None
        raise
    finally:
        report.quantization["accuracy"] = acc.to_dict()


def _accuracy_samples(input, reference, samples, options: CompileOptions) -> tuple[list | None, str]:  # noqa: ANN001
    """The samples of the accuracy report, and how they were made (None: no report). int8's is
    on --inputs when given (samples that neither calibrated nor selected), else on the
    calibration folder's selection share (said so: not held out)."""
    if samples is not None and options.quantize is not None and options.quantize.mode == "int8":
        if options.checks.inputs is None:
            picked = samples[1::2] if len(samples) >= 2 else samples
            return picked, (f"{options.accuracy.calibration_data} ({len(picked)} selection samples: they chose "
                            "the calibration and the float nodes; --inputs judges on held-out ones)")
    elif samples is not None:
        return samples, f"{options.accuracy.calibration_data} ({len(samples)} samples)"
    if options.checks.inputs is not None:
        from .inputs import load_inputs

        original = reference if not isinstance(reference, (str, os.PathLike)) else \
            load_model(input, check=False, infer_shapes=False)[0]
        samples = load_inputs(options.checks.inputs, original)
        return samples, f"{options.checks.inputs} ({len(samples)} samples)"
    if options.accuracy.samples < 1:
        if options.accuracy.budget:
            raise UsageError("--accuracy-budget needs --accuracy-samples >= 1 or --calibration-data")
        return None, ""
    from .accuracy import random_samples

    samples = random_samples(reference, options.accuracy.samples, options.checks.dims)
    return samples, f"random inputs the model accepts ({len(samples)} samples)"


def inspect(path: str | os.PathLike, values: bool = False) -> ModelSummary:
    """The model's interface, ops and weights, with every value's shape contract from
    symbolic shape inference (ONNX's, then ours)."""
    from .files import check_regular_input
    from .passes import PassContext
    from .passes.shapes import SymbolicShapesPass

    check_regular_input(path)   # a FIFO or device is refused at once, never read
    model, fmt, _ = load_model(path, check=False, infer_shapes=True)
    result = SymbolicShapesPass().run(model, PassContext())
    s = summarize(model, fmt, values=values)
    s.shape_assumptions = list(result.stats["assumptions"])
    s.shape_conflicts = list(result.stats["conflict_list"])
    s.no_shape_rule = dict(result.stats["no_rule"])
    s.input_sizes = _input_sizes(path)
    from .llm.spec import find_llm
    from .state import find_state_pairs, proposed_pairs

    llm = find_llm(model, Path(path))
    if llm is not None:   # its KV cache is the decoder's, not state pairs for the sequence batcher
        s.llm = llm.to_dict()
        return s
    pairs = find_state_pairs(model)
    s.state_pairs = [p.to_dict() for p in pairs]
    s.state_proposed = [p.to_dict() for p in proposed_pairs(model, pairs)]
    return s


def _input_sizes(path) -> dict:  # noqa: ANN001
    """What inputs.plan chooses for each symbol, on a fresh copy (planning folds constants)."""
    from .errors import McpError
    from .inputs import plan

    try:
        p = plan(load_model(path, check=False, infer_shapes=False)[0])
    except McpError as e:
        return {"error": str(e)}
    return {sym: {"size": size, "constraints": p.constraints.get(sym, [])} for sym, size in p.sizes.items()}
