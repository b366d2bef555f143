"""The library's entry points: what the CLI (and any other caller) uses."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import InvalidModelError, UsageError
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
    if options.target is not None:
        from .targets import get_target

        target = get_target(options.target)
        output = Path(output or DEFAULT_REPOSITORY)
        if output.suffix == FILE_EXTENSION:
            raise UsageError(f"--output {output}: with --target, --output is the model repository "
                             "folder (the .mcpir goes inside it)")
    else:
        if output is None:
            raise UsageError("--output is required without --target (a .mcpir file)")
        output = Path(output)
        if output.suffix != FILE_EXTENSION:
            raise UsageError(f"--output {output}: expected a {FILE_EXTENSION} file "
                             "(Triton repositories come with --target)")
        if output.is_dir():
            raise UsageError(f"--output {output} is a directory")
        if not output.parent.exists():
            raise UsageError(f"--output {output}: folder {output.parent} does not exist")
    if options.layout not in ("nchw", "nhwc"):
        raise UsageError(f"--layout: expected nchw or nhwc, got {options.layout!r}")
    t0 = time.perf_counter()
    model, fmt, warnings = load_model(input, check=options.check, infer_shapes=options.infer_shapes)
    if options.verify and fmt != "onnx":
        raise UsageError("--verify compares with onnxruntime on the original: give the .onnx as --input")
    t1 = time.perf_counter()
    records = []
    samples = None
    if options.calibration_data is not None:
        from .accuracy import load_samples

        samples = load_samples(options.calibration_data, model)
    weights_before = summarize(model, fmt).weight_bytes if options.quantize else 0
    if target is not None or options.passes or options.quantize or options.opset or options.layout != "nchw":
        from . import pipeline

        pm = pipeline.build(target, options.passes, options.disabled_passes, options.verify_each,
                            quantize=options.quantize, calibration=samples, opset=options.opset,
                            fold_size_limit=options.fold_size_limit, layout=options.layout)
        _, records = pm.run(model)
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
        stats = write_mcpir(model, output)
        report.output_bytes = stats.file_bytes
        report.files = [output.name]
    else:
        from .targets import TargetOptions
        from .targets.triton.config import sanitize_name

        report.warnings += target.check(model)
        name = options.name if options.name is not None else sanitize_name(Path(input).stem)
        result = target.emit(model, output, TargetOptions(
            name=name, backend=options.backend, force=options.force,
            serving={"params": options.serving}))
        report.output = str(result.root)
        report.files = result.files
        report.output_bytes = sum((result.root / f).stat().st_size for f in result.files)
        report.warnings += result.warnings
    t2 = time.perf_counter()
    report.seconds = {"load": round(t1 - t0, 4), "passes": round(tp - t1, 4), "emit": round(t2 - ta, 4)}
    if options.quantize is not None:
        report.seconds["accuracy"] = round(ta - tp, 4)
    if options.verify:
        if target is None:
            raise UsageError("--verify needs --target (it checks the emitted repository)")
        from .verify import verify

        v = verify(input, report.output, dims=options.verify_dims)
        report.verification = v.to_dict()
        report.seconds["verify"] = round(time.perf_counter() - t2, 4)
        v.raise_if_failed()
    return report


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

    if samples is not None:
        label = f"{options.calibration_data} ({len(samples)} samples)"
    else:
        if options.accuracy_samples < 1:
            if options.accuracy_budget:
                raise UsageError("--accuracy-budget needs --accuracy-samples >= 1 or --calibration-data")
            return
        samples = random_samples(model, options.accuracy_samples, options.verify_dims)
        label = f"random inputs ({len(samples)} samples)"
    reference = input if fmt == "onnx" else load_model(input, check=False, infer_shapes=False)[0]
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
    return s
