"""CompileOptions: everything one conversion is told, in typed groups, checked in one place.

The CLI fills it from flags, the zoo from a manifest, a program directly; `validate()` raises
UsageError naming the **flag** (the thing the user typed), and `compile_model` trusts what it
accepted. The quantization level has one home: `quantize` (a build file's or manifest's
`quantization_level` is merged into it by `with_target_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UsageError

if TYPE_CHECKING:   # passes are imported only by conversions that run them
    from .passes.quantize import QuantizeOptions

MB = 1 << 20
LAYOUTS = ("nchw", "nhwc")


@dataclass
class CheckOptions:
    """How the input is read and how the result is checked."""

    check: bool = True                   # --check: onnx.checker on the input
    infer_shapes: bool = True            # --infer-shapes: ONNX shape inference before import
    verify: bool = False                 # --verify: compare the emitted model with onnxruntime
    dims: dict[str, int] = field(default_factory=dict)    # --dims: symbol sizes for the inputs
    inputs: str | None = None            # --inputs: .npz (or a folder of them)
    initializer_inputs: str = "weights"  # --initializer-inputs: an initializer also listed as an input


@dataclass
class PipelineOptions:
    """Which passes run, and how (the pass context's settings)."""

    passes: list[str] | None = None      # --passes: instead of the default pipeline
    disabled: set[str] = field(default_factory=set)       # --disable-pass
    verify_each: bool = False            # --verify-each: IR invariants and each pass's claims
    opset: int | None = None             # --opset: raise the ai.onnx opset first
    fold_size_limit: int | None = None   # --fold-size-limit (bytes; None: 1 MiB)
    layout: str = "nchw"                 # --layout
    print_ir_after: set[str] = field(default_factory=set)   # --print-ir-after NAME (or "all")
    explain: set[str] = field(default_factory=set)          # --explain-pass NAME: why rules did not fire
    time_passes: bool = False            # --time-passes: each pass's time to stderr


@dataclass
class AccuracyOptions:
    """The quantized model against onnxruntime on the original."""

    calibration_data: str | None = None  # --calibration-data: folder of .npz samples
    budget: dict[str, float] = field(default_factory=dict)   # --accuracy-budget, e.g. {"cos": 0.99}
    samples: int = 16                    # --accuracy-samples
    auto_exclude: bool | None = None     # --auto-exclude (None: on when a budget is given)

    @property
    def selects_layers(self) -> bool:
        return bool(self.budget) and self.auto_exclude is not False


INITIALIZER_INPUTS = ("weights", "inputs")   # --initializer-inputs, a build file's initializer_inputs
QUANTIZATION_LEVELS = ("none", "fp8", "int4", "fp16", "bf16", "int8")   # --quantize, a build file's quantization_level


@dataclass
class TargetChoice:
    """Where the result goes: a .mcpir file (no target) or a target's artifacts."""

    name: str | None = None              # --target (None: write .mcpir)
    entry: str | None = None             # --name: the entry's name (default: from the file name)
    params: Any = None                   # the target's own options (Target.options_from)
    load_check: bool = True              # --load-check
    force: bool = False                  # --force


@dataclass
class CompileOptions:
    checks: CheckOptions = field(default_factory=CheckOptions)
    pipeline: PipelineOptions = field(default_factory=PipelineOptions)
    quantize: QuantizeOptions | None = None              # --quantize and its companions
    accuracy: AccuracyOptions = field(default_factory=AccuracyOptions)
    target: TargetChoice = field(default_factory=TargetChoice)

    @classmethod
    def for_target(cls, target: str, entry: str | None = None, *, backend: str = "python",
                   settings: dict[str, Any] | None = None, verify: bool = False,
                   dims: dict[str, int] | None = None, quantize: QuantizeOptions | None = None,
                   layout: str = "nchw", force: bool = False) -> CompileOptions:
        """The usual conversion for a program: `target`'s entry named `entry`, with the target's
        own `settings` (its build-file keys, e.g. {"max_batch_size": 16})."""
        from .targets import get_target

        options = cls(checks=CheckOptions(verify=verify, dims=dict(dims or {})),
                      pipeline=PipelineOptions(layout=layout), quantize=quantize,
                      target=TargetChoice(target, entry, force=force))
        t = get_target(target)
        settings = {**({"backend": backend} if "backend" in t.option_types else {}), **(settings or {})}
        return options.with_target_settings(t, {}, settings, "settings")

    @property
    def has_pipeline(self) -> bool:
        p = self.pipeline
        return bool(self.target.name is not None or p.passes or self.quantize or p.opset or p.layout != "nchw")

    def with_target_settings(self, target, flags: dict[str, Any], build_file: dict[str, Any] | None,  # noqa: ANN001
                             source: str = "the build file") -> CompileOptions:
        """The target's own options from its flags and a build file. The build file's compiler
        settings (`quantization_level`: --quantize, which wins when given) are read here and never
        reach the target: options flow one way, compiler -> target."""
        build_file = dict(build_file or {})
        level = build_file.pop("quantization_level", None)
        init_inputs = build_file.pop("initializer_inputs", None)
        parsed = target.options_from(flags, build_file, source)
        out = replace(self, target=replace(self.target, params=parsed.params))
        if level is not None and level not in QUANTIZATION_LEVELS:
            raise UsageError(f"{source}: quantization_level must be one of {', '.join(QUANTIZATION_LEVELS)}, "
                             f"got {level!r}")
        if init_inputs is not None:
            if init_inputs not in INITIALIZER_INPUTS:
                raise UsageError(f"{source}: initializer_inputs must be weights or inputs, got {init_inputs!r}")
            if self.checks.initializer_inputs == "weights":   # the flag's default: the build file decides
                out.checks = replace(out.checks, initializer_inputs=init_inputs)
        if level not in (None, "none") and out.quantize is None:
            from .passes.quantize import QuantizeOptions

            out.quantize = QuantizeOptions(mode=level)
        return out

    def validate(self) -> CompileOptions:
        """Flags that contradict each other, or would silently do nothing, are UsageErrors."""
        c, p, t = self.checks, self.pipeline, self.target
        if c.initializer_inputs not in INITIALIZER_INPUTS:
            raise UsageError(f"--initializer-inputs: expected weights or inputs, got {c.initializer_inputs!r}")
        if p.layout not in LAYOUTS:
            raise UsageError(f"--layout: expected nchw or nhwc, got {p.layout!r}")
        if p.fold_size_limit is not None and not p.fold_size_limit >= 0:
            raise UsageError(f"--fold-size-limit must be >= 0 MB, got {p.fold_size_limit / MB}")
        if p.opset is not None:
            from importlib.metadata import version

            if not 1 <= p.opset <= _newest_opset():
                raise UsageError(f"--opset {p.opset}: onnx {version('onnx')} knows opsets 1..{_newest_opset()}")
        if c.verify and t.name is None:
            raise UsageError("--verify needs --target or an .onnx output (it checks what was emitted; "
                             "an .mcpir file is checked by the target that serves it)")
        auto_int8 = self.quantize is None and getattr(t.params, "runtime", None) == "auto" and \
            self.accuracy.calibration_data is not None   # int8 as a candidate of the runtime profile
        if auto_int8 and getattr(t.params, "precision", "auto") != "auto":
            raise UsageError("--calibration-data with --runtime auto measures an int8 candidate: it needs "
                             f"--precision auto (got {t.params.precision}); --quantize int8 fixes int8")
        if auto_int8 and c.verify and c.inputs is None:
            raise UsageError("--runtime auto --calibration-data --verify needs --inputs DIR: an int8 entry is judged "
                             "on real inputs that neither calibrated nor selected")
        if c.inputs is not None and not c.verify and self.quantize is None and not auto_int8:
            raise UsageError("--inputs feeds --verify and the quantization accuracy report; give --verify (or --quantize)")
        if c.dims and not c.verify and self.quantize is None:
            raise UsageError("--dims sizes the inputs of --verify and of the quantization accuracy "
                             "report; give --verify (or --quantize)")
        if c.dims and c.inputs is not None:
            raise UsageError("--dims sizes generated inputs; with --inputs the arrays give the sizes")
        if self.quantize is None and not auto_int8 and (self.accuracy.budget or self.accuracy.calibration_data):
            raise UsageError("--accuracy-budget and --calibration-data need --quantize int8|int4|fp8|fp16|bf16 "
                             "(or, for int8 as a candidate the runtime profile measures, --runtime auto)")
        if p.disabled and not self.has_pipeline:
            raise UsageError("--disable-pass needs a pipeline: give --target, --passes, --quantize or --opset")
        if (p.print_ir_after or p.explain or p.time_passes) and not self.has_pipeline:
            raise UsageError("--print-ir-after, --explain-pass and --time-passes need a pipeline: give --target, "
                             "--passes, --quantize or --opset")
        if self.quantize is not None:
            self.quantize.validate()
            if self.quantize.mode == "int8":
                if self.accuracy.calibration_data is None:
                    raise UsageError("--quantize int8 needs --calibration-data DIR (one .npz per real input sample: "
                                     "at least 2, an even share calibrates and an odd one selects): drawn inputs "
                                     "calibrate nothing real")
                if c.verify and c.inputs is None:
                    raise UsageError("--quantize int8 --verify needs --inputs DIR: an int8 model is judged on real "
                                     "inputs that neither calibrated nor selected (drawn ones judge nothing real)")
                self.quantize.search = self.accuracy.auto_exclude is not False
            elif self.quantize.calibration_method != "auto" or self.quantize.int8_activations != "uint8":
                raise UsageError("--calibration-method and --int8-activations apply to --quantize int8")
        return self


def _newest_opset() -> int:
    import onnx

    return onnx.defs.onnx_opset_version()


def target_for(target: str | None, output: str | Path | None) -> str | None:
    """The target a conversion emits for: --target, or `onnx` for `-o out.onnx`."""
    if target is None and output is not None and Path(output).suffix == ".onnx":
        return "onnx"
    return target
