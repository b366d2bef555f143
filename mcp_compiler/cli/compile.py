"""`convert`, `inspect`, `passes`, `targets`: the compiler's commands."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import typer

from mcp_compiler.errors import UsageError

from .common import DebugOpt, JsonOpt, examples, one_model, parse_dims, reporter, run, watchdog, write_json

IN, PIPE, QUANT, TGT, CHECK, OUT = ("Input and output", "Pipeline", "Quantization", "Target",
                                    "Checks", "Reporting")


def _opt(default: Any, *names: str, panel: str, help: str, **kw: Any) -> Any:
    return typer.Option(default, *names, rich_help_panel=panel, help=help, **kw)


def _lower(v: Any) -> Any:
    """Values of a fixed set are matched case-insensitively (`--layout NHWC`)."""
    return v.lower() if isinstance(v, str) else v


# The options of `convert`, by panel (one line each in the signature below).
ModelArg = typer.Argument(None, help="The ONNX (or .mcpir) model to convert.", dir_okay=False, show_default=False)
InputOpt = _opt(None, "--input", "-i", panel=IN, help="The model, the older way (same as the argument).",
                dir_okay=False, hidden=True)
OutputOpt = _opt(None, "--output", "-o", panel=IN, show_default=False,
                 help="Without --target: the .mcpir file, or the optimized .onnx file, to write. With --target: "
                      "the model repository folder (default: model_repository).")
TargetOpt = _opt(None, "--target", "-t", panel=IN, help="Emit for this target (see `mcp-cli targets`).")
NameOpt = _opt(None, "--name", panel=IN, help="The entry's name in the repository (default: the input file's "
               "stem, sanitized).")
ForceOpt = _opt(False, "--force", panel=IN, help="Replace an existing DIR/NAME, .mcpir, .onnx or --report file (never the input).")
CheckOnnxOpt = _opt(True, "--check/--no-check", panel=IN, help="Run onnx.checker on the input.")
InferOpt = _opt(True, "--infer-shapes/--no-infer-shapes", panel=IN, help="Run ONNX shape inference before import.")
InitInputsOpt = _opt("weights", "--initializer-inputs", panel=IN, metavar="weights|inputs",
                     help="An initializer the model also lists as a graph input: a weight (the default, as "
                          "onnxruntime's optimizers and onnxsim read it) or an input a caller may feed.")

PassesOpt = _opt(None, "--passes", panel=PIPE, metavar="NAME[,NAME...]",
                 help="Run these passes instead of the default pipeline (see `mcp-cli passes`).")
DisableOpt = _opt(None, "--disable-pass", panel=PIPE, metavar="NAME", help="Skip a pass (repeatable).")
VerifyEachOpt = _opt(False, "--verify-each", panel=PIPE,
                     help="After every pass: check the IR's invariants and what the pass claims to establish.")
PrintIrOpt = _opt(None, "--print-ir-after", panel=PIPE, metavar="NAME|all",
                  help="Print the IR (one line per node) to stderr after this pass (repeatable).")
TimePassesOpt = _opt(False, "--time-passes", panel=PIPE,
                     help="After the pipeline: each pass's wall time (summed over its runs), slowest first, to stderr.")
ExplainOpt = _opt(None, "--explain-pass", panel=PIPE, metavar="NAME",
                  help="List why candidate sites of this rewrite pass did not fire (repeatable).")
OpsetOpt = _opt(None, "--opset", panel=PIPE, help="Raise the model's ai.onnx opset to this first (onnx version "
                "converter); fusions then use the newer ops: HardSwish 14, LayerNormalization 17, Gelu 20.")
FoldOpt = _opt(None, "--fold-size-limit", panel=PIPE, metavar="MB",
               help="Constant folding may store results up to this size (default: only where the constants "
                    "they are made from go, so the weights never grow). Give it to materialize generated weights.")
LayoutOpt = _opt("nchw", "--layout", panel=PIPE, metavar="nchw|nhwc",
                 help="nhwc: 4-D image inputs (and image outputs) become channels-last [N, H, W, C]; "
                      "transposes inside move and cancel.")

QuantOpt = _opt(None, "--quantize", "--quantization-level", panel=QUANT, metavar="none|int8|int4|fp8|fp16|bf16",
                help="int8: static QDQ of weights and activations, calibrated on --calibration-data (int8 "
                     "kernels; the nodes that break the budget stay in float); int4 (group-wise, weight-only) "
                     "or fp8 MatMul/Gemm weights; or every large float32 weight stored in fp16/bf16 (half the "
                     "size, float32 compute); an accuracy report against onnxruntime on the original follows.")
CalibMethodOpt = _opt("auto", "--calibration-method", panel=QUANT, metavar="auto|minmax|percentile|entropy",
                      help="int8 activation ranges: auto measures minmax and percentile (99.999) and keeps the "
                           "closer to the float model on the selection samples.")
Int8ActOpt = _opt("uint8", "--int8-activations", panel=QUANT, metavar="uint8|int8",
                  help="int8: the activations' type (uint8: what VNNI multiplies fastest).")
GroupOpt = _opt(32, "--group-size", panel=QUANT, help="int4: weights per group (16..256).")
SymOpt = _opt(False, "--symmetric", panel=QUANT, help="int4: no zero point.")
Int4MethodOpt = _opt("search", "--int4-method", panel=QUANT, metavar="search|rtn",
                     help="int4 scales: search (clipping ranges and a least-squares scale per group; with "
                          "--calibration-data, weighted by the layer's input) or rtn (round to nearest).")
Int4FmtOpt = _opt("matmulnbits", "--int4-format", panel=QUANT, metavar="matmulnbits|qdq",
                  help="int4 lowering: com.microsoft.MatMulNBits (fast on CPU) or DequantizeLinear int4 "
                       "with block_size (opset 21).")
Int4AccOpt = _opt(0, "--int4-accuracy-level", panel=QUANT,
                  help="MatMulNBits accuracy_level: 0 float compute, 4 int8 activations (faster, less exact).")
Fp8FmtOpt = _opt("e4m3fn", "--fp8-format", panel=QUANT, metavar="e4m3fn|e5m2", help="fp8: the float8 type of the weights.")
Fp8TensorOpt = _opt(False, "--fp8-per-tensor", panel=QUANT,
                    help="fp8: one scale per tensor (default: per output channel).")
QConvOpt = _opt(False, "--quantize-conv", panel=QUANT, help="Quantize Conv weights too (int4 needs "
                "--int4-format qdq).")
QExclOpt = _opt(None, "--quantize-exclude", panel=QUANT, metavar="PATTERN",
                help="Leave nodes or weights whose name matches this glob in float (repeatable).")
QMinOpt = _opt(4096, "--quantize-min-elements", panel=QUANT, help="Weights with fewer values stay in float.")
QMaxErrOpt = _opt(None, "--quantize-max-error", panel=QUANT, help="Leave a layer in float when its relative "
                  "weight error (||w - q|| / ||w||) exceeds this.")
CalibOpt = _opt(None, "--calibration-data", panel=QUANT, help="Folder of .npz input samples (real inputs): "
                "int8's calibration (even ones) and selection (odd ones), fp8's activation scales, the "
                "accuracy report's inputs.")
BudgetOpt = _opt(None, "--accuracy-budget", panel=QUANT, metavar="KEY=V[,...]",
                 help="Fail (exit 1, nothing written) when the quantized model is outside it: cos=MIN, "
                      "top1=MIN, max-abs=MAX, rel=MAX on every float output and each slice of it "
                      "(slice=MAX, by default 3x what cos/rel allow), match=MIN on integer outputs "
                      "(default 0.99).")
AutoExclOpt = _opt(None, "--auto-exclude/--no-auto-exclude", panel=QUANT,
                   help="With --accuracy-budget (on by default then): when the budget fails, measure each "
                        "quantized layer's effect and keep the most sensitive in float until it holds.")
AccSamplesOpt = _opt(16, "--accuracy-samples", panel=QUANT, help="Random input sets for the accuracy report "
                     "(0: none).")

ConfigOpt = _opt(None, "--config", panel=TGT, help="YAML build file with the target's settings (flags "
                 "override it).")
LoadCheckOpt = _opt(True, "--load-check/--no-load-check", panel=TGT,
                    help="Load the emitted model in its serving runtime before the entry is moved into place.")

CONVERT_TIMEOUT_S = 3600.0   # a whole conversion (the profile, --verify): a Loop that runs for ever ends
TimeoutOpt = _opt(CONVERT_TIMEOUT_S, "--timeout", panel=CHECK, min=0.0, metavar="SECONDS",
                  help="Give up after this many seconds, exit 1, with nothing of the output left (a --verify or "
                       "--runtime auto profile of a model whose Loop runs for ever); 0: no limit.")
VerifyOpt = _opt(False, "--verify", panel=CHECK, help="Compare the result with onnxruntime on the original "
                 "(exit 1 if it differs).")
DimsOpt = _opt(None, "--dims", panel=CHECK, metavar="NAME=SIZE[,...]",
               help="Symbol sizes for --verify, e.g. N=2,H=64 (default: sizes the model's ops accept).")
InputsOpt = _opt(None, "--inputs", panel=CHECK, help="Your own inputs for --verify and the accuracy report: "
                 "an .npz (arrays named like the inputs) or a folder of them.")
ReportOpt = _opt(None, "--report", panel=OUT, help="Write the conversion report (JSON) here.")
VerboseOpt = _opt(False, "--verbose", "-v", panel=OUT, help="Show per-pass times and node counts.")

CONVERT_EXAMPLES = examples(
    "mcp-cli convert model.onnx -o model.mcpir",
    "mcp-cli convert model.onnx -o optimized.onnx --verify",
    "mcp-cli convert model.onnx -t triton-v1.12 -o model_repository --verify",
    ("mcp-cli convert model.onnx -t triton-v1.12 --quantize int4",
     "  --accuracy-budget cos=0.99"),
    ("mcp-cli convert model.onnx -t triton-v1.12 --quantize int8",
     "  --calibration-data calib/ --inputs judge/ --verify"),
    ("mcp-cli convert model.onnx -t triton-v1.12 --max-batch-size 16",
     "  --preferred-batch-size 4,8 --json"),
    ("mcp-cli convert --input model.onnx --output model.mcpir",
     "  --target triton-v1.12 --dynamic-batch true"),
    "mcp-cli convert model.mcpir -t triton-v1.12 -o model_repository")


def with_target_flags(fn: Callable) -> Callable:
    """`convert`'s `target_flags` parameter becomes every target's own flags (each declared by its
    target: Target.convert_flags, in the target's help panel); the command gets their values as
    one dict, and each target turns the ones given into its settings (Target.settings_from_flags)."""
    import functools
    import inspect

    from mcp_compiler.targets import TARGETS

    owner: dict[str, str] = {}
    declared = []
    for cls in TARGETS.values():
        for f in cls().convert_flags():
            if f.name in owner:
                raise RuntimeError(f"targets {owner[f.name]} and {cls.name} both declare convert flag {f.name}")
            owner[f.name] = cls.name
            declared.append(f)
    P = inspect.Parameter
    sig = inspect.signature(fn, eval_str=True)
    params = []
    for p in sig.parameters.values():
        if p.name == "target_flags":
            params += [P(f.name, P.KEYWORD_ONLY, default=f.option, annotation=f.annotation) for f in declared]
        else:
            params.append(p.replace(kind=P.KEYWORD_ONLY))

    @functools.wraps(fn)
    def wrapper(**kw: Any) -> Any:
        return fn(target_flags={n: kw.pop(n) for n in owner}, **kw)

    wrapper.__signature__ = sig.replace(parameters=params)
    TARGET_FLAG_OWNER.update(owner)
    return wrapper


TARGET_FLAG_OWNER: dict[str, str] = {}   # each target's convert flag -> the target that declares it


@with_target_flags
def convert(
    model: Optional[Path] = ModelArg, input: Optional[Path] = InputOpt, output: Optional[str] = OutputOpt,
    target: Optional[str] = TargetOpt, name: Optional[str] = NameOpt, force: bool = ForceOpt,
    check: bool = CheckOnnxOpt, infer_shapes: bool = InferOpt, initializer_inputs: str = InitInputsOpt,
    passes: Optional[str] = PassesOpt, disable_pass: Optional[list[str]] = DisableOpt,
    verify_each: bool = VerifyEachOpt, print_ir_after: Optional[list[str]] = PrintIrOpt,
    explain_pass: Optional[list[str]] = ExplainOpt, time_passes: bool = TimePassesOpt,
    opset: Optional[int] = OpsetOpt,
    fold_size_limit: Optional[float] = FoldOpt, layout: str = LayoutOpt,
    quantize: Optional[str] = QuantOpt, group_size: int = GroupOpt, symmetric: bool = SymOpt,
    int4_method: str = Int4MethodOpt, int4_format: str = Int4FmtOpt, int4_accuracy_level: int = Int4AccOpt, fp8_format: str = Fp8FmtOpt,
    fp8_per_tensor: bool = Fp8TensorOpt, quantize_conv: bool = QConvOpt,
    quantize_exclude: Optional[list[str]] = QExclOpt, quantize_min_elements: int = QMinOpt,
    quantize_max_error: Optional[float] = QMaxErrOpt, calibration_data: Optional[Path] = CalibOpt,
    calibration_method: str = CalibMethodOpt, int8_activations: str = Int8ActOpt,
    accuracy_budget: Optional[str] = BudgetOpt, auto_exclude: Optional[bool] = AutoExclOpt,
    accuracy_samples: int = AccSamplesOpt,
    config: Optional[Path] = ConfigOpt, load_check: bool = LoadCheckOpt,
    target_flags: Optional[dict] = None,   # every target's own flags: with_target_flags
    verify: bool = VerifyOpt, dims: Optional[str] = DimsOpt, inputs: Optional[Path] = InputsOpt,
    timeout: Optional[float] = TimeoutOpt,
    report: Optional[Path] = ReportOpt, verbose: bool = VerboseOpt,
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Convert an ONNX model to MCP-IR (.mcpir) or, with --target, to a Triton model repository."""
    flags = {k: _lower(v) if k in _CHOICES else v for k, v in locals().items()}
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler.api import compile_model
        from mcp_compiler.files import check_output

        path = one_model(model, input)
        options = compile_options(flags)
        if print_ir_after or time_passes:
            _ir_to_stderr()
        if report is not None:
            check_output(report, "--report", force=bool(flags["force"]), inputs=(path, output or None))
        if output == "":
            raise UsageError("--output: empty path")
        with rep.status(f"converting {path}"), watchdog(rep, timeout, "convert") if timeout else nullcontext():
            result = compile_model(path, None if output is None else Path(output), options)
        if report is not None:
            write_json(report, result.to_dict())
        rep.converted(result, verbose=verbose)

    run(rep, debug, body)


_CHOICES = ("layout", "quantize", "int4_method", "int4_format", "fp8_format", "target", "calibration_method",
            "int8_activations")


def _ir_to_stderr() -> None:
    import logging
    import sys

    log = logging.getLogger("mcp_compiler.ir")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _budget(text: str | None) -> dict[str, float]:
    if text is None:
        return {}
    from mcp_compiler.accuracy import parse_budget

    return parse_budget(text)


def compile_options(f: dict[str, Any]):  # noqa: ANN201 - options.CompileOptions
    """CompileOptions from `convert`'s flags (by parameter name)."""
    from mcp_compiler.options import AccuracyOptions, CheckOptions, CompileOptions, PipelineOptions, TargetChoice

    fold = f["fold_size_limit"]
    if fold is not None and not 0 <= fold <= 2**40 / 2**20:
        raise UsageError(f"--fold-size-limit must be between 0 and {2**20} MB, got {fold}")
    options = CompileOptions(
        checks=CheckOptions(check=f["check"], infer_shapes=f["infer_shapes"], verify=f["verify"],
                            dims=parse_dims(f["dims"]), inputs=_str(f["inputs"]),
                            initializer_inputs=str(f.get("initializer_inputs") or "weights").lower()),
        pipeline=PipelineOptions(
            passes=[p.strip() for p in f["passes"].split(",") if p.strip()] if f["passes"] else None,
            disabled=set(f["disable_pass"] or ()), verify_each=f["verify_each"], opset=f["opset"],
            fold_size_limit=None if fold is None else int(fold * 2**20),
            layout=str(f["layout"]), print_ir_after=set(f["print_ir_after"] or ()),
            explain=set(f["explain_pass"] or ()), time_passes=bool(f.get("time_passes"))),
        quantize=_quantize(f),
        accuracy=AccuracyOptions(calibration_data=_str(f["calibration_data"]),
                                 budget=_budget(f["accuracy_budget"]), samples=f["accuracy_samples"],
                                 auto_exclude=f["auto_exclude"]),
        target=TargetChoice(name=_target_name(f), entry=f["name"], load_check=f["load_check"], force=f["force"]))
    return _with_target(options, f)   # validated once, by compile_model


def _target_name(f: dict[str, Any]) -> str | None:
    from mcp_compiler.options import target_for

    return target_for(f["target"], f["output"] or None)


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _quantize(f: dict[str, Any]):  # noqa: ANN202 - passes.quantize.QuantizeOptions or None
    if f["quantize"] in (None, "none"):
        return None
    from mcp_compiler.passes.quantize import QuantizeOptions  # (loads every pass: only when quantizing)

    return QuantizeOptions(
        mode=str(f["quantize"]), block_size=f["group_size"], symmetric=f["symmetric"],
        int4_method=str(f["int4_method"]), int4_format=str(f["int4_format"]), accuracy_level=f["int4_accuracy_level"],
        fp8_format=str(f["fp8_format"]), per_channel=not f["fp8_per_tensor"], conv=f["quantize_conv"],
        exclude=list(f["quantize_exclude"] or ()), min_elements=f["quantize_min_elements"],
        max_error=f["quantize_max_error"], calibration_method=str(f.get("calibration_method") or "auto"),
        int8_activations=str(f.get("int8_activations") or "uint8"))


def _with_target(options, f: dict[str, Any]):  # noqa: ANN001, ANN202 - CompileOptions
    """The chosen target's settings from its own flags (and --config); a flag of another target,
    or any with no target, is a UsageError naming it."""
    given = {k: v for k, v in (f["target_flags"] or {}).items() if v is not None and v is not False}
    name = _target_name(f)
    if name is None:
        if given or f["config"] is not None:
            flag = "--config" if f["config"] is not None else "--" + next(iter(given)).replace("_", "-")
            raise UsageError(f"{flag} needs --target (it is a target setting)")
        return options
    from mcp_compiler.targets import get_target

    t = get_target(name)
    for k in given:
        if TARGET_FLAG_OWNER.get(k) != name:
            what = "the ONNX output" if name == "onnx" else f"target {name}"
            raise UsageError(f"--{k.replace('_', '-')} is not a setting of {what} (it is "
                             f"{TARGET_FLAG_OWNER.get(k)}'s)")
    settings = t.settings_from_flags({k: v for k, v in (f["target_flags"] or {}).items()
                                      if TARGET_FLAG_OWNER.get(k) == name})
    build_file = t.load_build_file(f["config"]) if f["config"] is not None else {}
    return options.with_target_settings(t, settings, build_file, f"--config {f['config']}")


def inspect(
    file: Path = typer.Argument(..., help="An ONNX (.onnx) or MCP-IR (.mcpir) file."),
    values: bool = typer.Option(False, "--values", help="Also list every node output's shape."),
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Show a model's interface with its shape contracts, ops, weights and opsets.

    Shape contracts are symbolic dims and expressions such as (H - 1) // 32 + 1, from symbolic
    shape inference; also the dims inference had to assume equal, any that conflict, and the
    input sizes the checks use."""
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler import api

        rep.summary(api.inspect(_model_file(file), values=values), str(file))

    run(rep, debug, body)


def _model_file(path: Path) -> Path:
    """inspect DIR: a repository entry (DIR/config.pbtxt) is its newest version's model file; any
    other folder is one line saying what inspect takes."""
    if not path.is_dir():
        return path
    if (path / "config.pbtxt").is_file():
        versions = sorted((int(v.name), v) for v in path.iterdir() if v.is_dir() and v.name.isdigit() and len(v.name) < 10)
        for _, v in reversed(versions):
            for name in ("model.mcpir", "model.onnx"):
                if (v / name).is_file():
                    return v / name
        raise UsageError(f"{path}: a model entry with no version folder holding model.mcpir or model.onnx")
    entries = sorted(p.name for p in path.iterdir() if (p / "config.pbtxt").is_file()) if os.access(path, os.R_OK) else []
    more = f": inspect one of its entries ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''})" if entries else ""
    raise UsageError(f"{path} is a folder; inspect takes a model file (.onnx, .mcpir, .gguf) or an entry DIR/NAME{more}")


def list_passes(json_out: bool = JsonOpt) -> None:
    """List the passes --passes and --disable-pass accept, in default-pipeline order."""
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler.pass_catalog import CATALOG  # the passes themselves import numpy and onnx

        rows = CATALOG
        rep.json({"passes": rows})
        if not json_out:
            for r in rows:
                needs = f" (needs {', '.join(r['requires'])})" if r["requires"] else ""
                rep.out.print(f"{r['name']}: {r['summary']}{needs}", markup=False)

    run(rep, False, body)


def list_targets(json_out: bool = JsonOpt) -> None:
    """List the targets --target accepts."""
    rep = reporter(json_out)

    def body() -> None:
        from mcp_compiler.targets import TARGETS

        rows = [{"name": t.name, "runtime": t().runtime, "opsets": list(t().opset_range),
                 "description": t.description, "commands": [c.__command_name__ for c in t().commands()]}
                for t in TARGETS.values()]
        rep.json({"targets": rows})
        if not json_out:
            for r in rows:
                rep.out.print(f"{r['name']}: {r['description']}; runs on {r['runtime']}, "
                              f"ai.onnx opsets {r['opsets'][0]}..{r['opsets'][1]}"
                              + (f"; commands: {', '.join(r['commands'])}" if r["commands"] else
                                 "; no commands of its own"), markup=False)

    run(rep, False, body)
