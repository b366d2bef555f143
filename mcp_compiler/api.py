"""The library's entry points: what the CLI (and any other caller) uses."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import InvalidModelError, OutputExistsError, UsageError
from .files import write_error
from .frontend import load_onnx
from .ir.graph import Model
from .ir_schema import FILE_EXTENSION
from .mcpir.writer import write_mcpir
from .summary import ModelSummary, summarize

DEFAULT_REPOSITORY = "model_repository"


@dataclass
class ConvertOptions:
    check: bool = True              # run onnx.checker on the input
    infer_shapes: bool = True       # run ONNX shape inference before import
    target: str | None = None       # None: write a .mcpir file
    name: str | None = None         # model name in the repository (default: the file stem)
    backend: str = "python"
    force: bool = False             # replace an existing DIR/NAME
    serving: Any = None             # targets.triton.params.ServingParams
    verify: bool = False            # run verify() right after emitting
    verify_dims: dict[str, int] = field(default_factory=dict)
    passes: list[str] | None = None     # None: the target's default pipeline (none without target)
    disabled_passes: set[str] = field(default_factory=set)
    verify_each: bool = False           # check IR invariants after every pass
    quantize: Any = None                # passes.quantize.QuantizeOptions (None: no quantization)
    calibration_data: str | None = None     # folder of .npz input samples (activation ranges, accuracy)
    accuracy_budget: dict[str, float] = field(default_factory=dict)   # e.g. {"cos": 0.99}
    accuracy_samples: int = 2           # random input sets for the accuracy report (no --calibration-data)
    opset: int | None = None            # raise the ai.onnx opset to this first (upgrade-opset)
    fold_size_limit: int | None = None  # bytes a folded constant may grow to (None: 1 MiB)
    layout: str = "nchw"                # "nhwc": image inputs/outputs channels-last (layout-nhwc)
    load_check: bool = True             # the target's runtime loads the entry before it is moved in
    inputs: str | None = None           # .npz (or a folder of them): inputs for --verify and the accuracy report


@dataclass
class ConvertReport:
    input: str
    output: str
    nodes: int
    weights: int
    weight_bytes: int
    output_bytes: int
    target: str | None = None
    files: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    verification: dict | None = None
    passes: list[dict] = field(default_factory=list)
    quantization: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def load_model(path: str | os.PathLike, *, check: bool = True, infer_shapes: bool = True) -> tuple[Model, str, list[str]]:
    """Load an ONNX or MCP-IR file: (model, format, warnings).

    A file is MCP-IR when it carries the identifier or is named *.mcpir (then a wrong identifier
    is reported as such, rather than as a failed ONNX parse).
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
    loaded = load_onnx(path, check=check, infer_shapes=infer_shapes)
    return loaded.model, "onnx", loaded.warnings


def convert(input: str | os.PathLike, output: str | os.PathLike | None,
            options: ConvertOptions | None = None) -> ConvertReport:
    """ONNX (or MCP-IR) -> `.mcpir`, or with a target -> that target's artifacts (a Triton
    repository).

    Outputs are written atomically: a failure leaves nothing behind.
    """
    options = options or ConvertOptions()
    _quantization_from_serving(options)
    target = None
    if options.target is not None:   # (imports onnxruntime: not for a plain .mcpir)
        from .targets import get_target

        target = get_target(options.target)
    _check_flags(options, target)
    output = _check_paths(input, output, options, target)
    t0 = time.perf_counter()
    model, fmt, warnings = load_model(input, check=options.check, infer_shapes=options.infer_shapes)
    if options.verify and fmt != "onnx":
        raise UsageError("--verify compares with onnxruntime on the original: give the .onnx as --input")
    if options.verify_dims:
        from .verify import check_dims

        check_dims(model, options.verify_dims)
    if options.opset is not None and model.onnx_opset is not None and options.opset < model.onnx_opset:
        raise UsageError(f"--opset {options.opset}: the model is at opset {model.onnx_opset}; "
                         "--opset can only raise it")
    t1 = time.perf_counter()
    samples = None
    if options.calibration_data is not None:
        from .accuracy import load_samples

        samples = load_samples(options.calibration_data, model)
    weights_before = summarize(model, fmt).weight_bytes if options.quantize else 0
    records = _run_pipeline(model, target, options, samples)
    if options.quantize is not None and options.opset is None and not _quantized_any(records) \
            and any(r.name == "upgrade-opset" and r.modified for r in records):
        # Nothing was quantized: the opset raised for it would be a change for nothing.
        model = load_model(input, check=False, infer_shapes=options.infer_shapes)[0]
        records = _run_pipeline(model, target, options, samples, quantize=False)
        warnings = [*warnings, "--quantize: nothing to quantize; the model is left at its opset"]
    tp = time.perf_counter()
    s = summarize(model, fmt)
    report = ConvertReport(input=str(input), output=str(output), nodes=s.nodes, weights=s.weights,
                           weight_bytes=s.weight_bytes, output_bytes=0, target=options.target,
                           warnings=list(warnings), passes=[asdict(r) for r in records])
    report.warnings += [w for r in records for w in r.warnings]
    if options.quantize is not None:
        report.quantization = _quantization_report(options, records, weights_before, s.weight_bytes)
        if report.quantization["quantized"]:
            _check_accuracy(input, fmt, model, samples, options, report)
        else:
            report.warnings.append("--quantize: no weight was quantized (see the report's "
                                   "quantization.skipped for why)")
    ta = time.perf_counter()
    if target is None:
        try:
            stats = write_mcpir(model, output)
        except OSError as e:
            raise write_error(output, e) from None
        report.output_bytes = stats.file_bytes
        report.files = [output.name]
    else:
        _emit(model, target, input, output, options, report)
    t2 = time.perf_counter()
    report.seconds = {"load": round(t1 - t0, 4), "passes": round(tp - t1, 4), "emit": round(t2 - ta, 4)}
    if options.quantize is not None:
        report.seconds["accuracy"] = round(ta - tp, 4)
    if report.verification is not None:
        report.seconds["verify"] = report.verification.pop("seconds")
    report.warnings = list(dict.fromkeys(report.warnings))  # shape inference runs twice: say it once
    return report


def _check_paths(input, output, options: ConvertOptions, target) -> Path:  # noqa: ANN001
    """The output, checked before any work: the right kind, writable, not there without --force."""
    from .files import check_output, check_regular_input

    check_regular_input(input)
    if target is not None:
        output = Path(DEFAULT_REPOSITORY if output is None else output)
        if output.suffix == FILE_EXTENSION:
            raise UsageError(f"--output {output}: with --target, --output is the model repository "
                             "folder (the .mcpir goes inside it)")
        check_output(output, "--output", directory=True)
        return output
    if output is None:
        raise UsageError("--output is required without --target (a .mcpir file)")
    output = Path(output)
    if output.suffix != FILE_EXTENSION:
        raise UsageError(f"--output {output}: expected a {FILE_EXTENSION} file "
                         "(Triton repositories come with --target)")
    check_output(output, "--output")
    if output.exists() and not options.force:
        raise OutputExistsError(f"{output} exists; pass --force to replace it")
    return output


def _check_flags(options: ConvertOptions, target) -> None:  # noqa: ANN001
    """Flags that would silently do nothing are errors."""
    if options.layout not in ("nchw", "nhwc"):
        raise UsageError(f"--layout: expected nchw or nhwc, got {options.layout!r}")
    if options.verify and target is None:
        raise UsageError("--verify needs --target (it checks the emitted repository)")
    if options.inputs is not None and not options.verify and options.quantize is None:
        raise UsageError("--inputs feeds --verify and the quantization accuracy report; give --verify (or --quantize)")
    if options.verify_dims and not options.verify and options.quantize is None:
        raise UsageError("--dims sizes the inputs of --verify and of the quantization accuracy "
                         "report; give --verify (or --quantize)")
    if options.disabled_passes and not _has_pipeline(options, target):
        raise UsageError("--disable-pass needs a pipeline: give --target, --passes, --quantize or --opset")


def _has_pipeline(options: ConvertOptions, target) -> bool:  # noqa: ANN001
    return bool(target is not None or options.passes or options.quantize or options.opset
                or options.layout != "nchw")


def _run_pipeline(model: Model, target, options: ConvertOptions, samples,  # noqa: ANN001
                  quantize: bool = True) -> list:
    if not _has_pipeline(options, target):
        return []
    from . import pipeline

    pm = pipeline.build(target, options.passes, options.disabled_passes, options.verify_each,
                        quantize=options.quantize if quantize else None, calibration=samples,
                        opset=options.opset, fold_size_limit=options.fold_size_limit, layout=options.layout)
    return pm.run(model)[1]


def _quantized_any(records: list) -> bool:
    return any(r.name.startswith("quantize-") and r.modified for r in records)


def _emit(model: Model, target, input, output: Path, options: ConvertOptions,  # noqa: ANN001
          report: ConvertReport) -> None:
    """The target's entry; the load check and --verify run on the staged entry, so a model that
    fails either never replaces anything."""
    from .targets import TargetOptions
    from .targets.triton.config import sanitize_name

    def verify_staged(entry: Path) -> None:
        from .verify import verify

        t = time.perf_counter()
        v = verify(input, entry, dims=options.verify_dims, inputs=options.inputs)
        v.repository = str(Path(output) / name)
        report.verification = {**v.to_dict(), "seconds": round(time.perf_counter() - t, 4)}
        v.raise_if_failed()

    report.warnings += target.check(model)
    name = options.name if options.name is not None else sanitize_name(Path(input).stem)
    result = target.emit(model, output, TargetOptions(
        name=name, backend=options.backend, force=options.force, serving={"params": options.serving},
        load_check=options.load_check, check=verify_staged if options.verify else None))
    report.output = str(result.root)
    report.files = result.files
    report.output_bytes = sum((result.root / f).stat().st_size for f in result.files)
    report.warnings += result.warnings


def _quantization_from_serving(options: ConvertOptions) -> None:
    """The target's `quantization_level` and --quantize are one setting: each implies the other."""
    level = getattr(options.serving, "quantization_level", "none")
    if options.quantize is None and level not in (None, "none"):
        from .passes.quantize import QuantizeOptions

        options.quantize = QuantizeOptions(mode=level).validate()
    elif options.quantize is not None and options.target is not None:
        if options.serving is None:
            from .targets.triton.params import ServingParams

            options.serving = ServingParams()
        options.serving.quantization_level = options.quantize.mode


def _quantization_report(options: ConvertOptions, records: list, before: int, after: int) -> dict:
    rows = [d for r in records if r.name.startswith("quantize-") for d in r.details]
    q = options.quantize
    return {
        "mode": q.mode, "options": asdict(q),
        "quantized": [r for r in rows if r["action"] == "quantized"],
        "skipped": [r for r in rows if r["action"] == "skipped"],
        "weight_bytes_before": before, "weight_bytes_after": after,
        "compression": round(before / after, 3) if after else None,
        "opset": next(({"from": r.stats["from"], "to": r.stats["to"]} for r in records
                       if r.name == "upgrade-opset" and r.modified), None),
    }


def _check_accuracy(input, fmt: str, model: Model, samples, options: ConvertOptions,  # noqa: ANN001
                    report: ConvertReport) -> None:
    """Quantized vs onnxruntime on the original, on the calibration samples or random inputs;
    raises AccuracyError (before anything is written) when outside the budget."""
    from .accuracy import check_budget, measure, random_samples

    reference = input if fmt == "onnx" else load_model(input, check=False, infer_shapes=False)[0]
    if samples is not None:
        label = f"{options.calibration_data} ({len(samples)} samples)"
    elif options.inputs is not None:
        from .inputs import load_inputs

        original = reference if fmt != "onnx" else load_model(input, check=False, infer_shapes=False)[0]
        samples = load_inputs(options.inputs, original)
        label = f"{options.inputs} ({len(samples)} samples)"
    else:
        if options.accuracy_samples < 1:
            if options.accuracy_budget:
                raise UsageError("--accuracy-budget needs --accuracy-samples >= 1 or --calibration-data")
            return
        samples = random_samples(reference, options.accuracy_samples, options.verify_dims)
        label = f"random inputs the model accepts ({len(samples)} samples)"
    acc = measure(reference, model, samples, label)
    report.quantization["accuracy"] = acc.to_dict()
    try:
        check_budget(acc, options.accuracy_budget)
    finally:
        report.quantization["accuracy"] = acc.to_dict()


def inspect(path: str | os.PathLike, values: bool = False) -> ModelSummary:
    """The model's interface, ops and weights, with every value's shape contract from
    symbolic shape inference (ONNX's, then ours)."""
    from .passes import PassContext
    from .passes.shapes import SymbolicShapesPass

    model, fmt, _ = load_model(path, check=False, infer_shapes=True)
    result = SymbolicShapesPass().run(model, PassContext())
    s = summarize(model, fmt, values=values)
    s.shape_assumptions = list(result.stats["assumptions"])
    s.shape_conflicts = list(result.stats["conflict_list"])
    s.no_shape_rule = dict(result.stats["no_rule"])
    s.input_sizes = _input_sizes(path)
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
