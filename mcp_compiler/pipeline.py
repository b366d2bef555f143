"""Named pass pipelines, read top to bottom."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import UsageError
from .options import PipelineOptions
from .passes import PASSES, Pass, PassContext, PassManager, Repeat
from .passes import normalize as N
from .passes.layout import LayoutNhwcPass
from .passes.rewrite import UpgradeOpsetPass
from .passes.shapes import SymbolicShapesPass

if TYPE_CHECKING:
    from .passes.quantize import QuantizeOptions


def default_pipeline(target=None, quantize: QuantizeOptions | None = None,  # noqa: ANN001
                     opset: int | None = None, layout: str = "nchw") -> list[Pass | Repeat]:
    """The opset upgrade (--opset, or what quantization needs: first, so that normalization
    cleans up after onnx's version converter and the fusions may use the newer ops),
    normalization, fusions, the NHWC interface (--layout nhwc), quantization, then the
    target's own rewrite rules and shape inference."""
    if quantize is not None:
        from .passes.quantize import quantize_pass, required_opset
    need = max(opset or 0, required_opset(quantize) if quantize else 0)
    steps: list[Pass | Repeat] = [UpgradeOpsetPass(need)] if need else []
    steps += [
        N.ConstantToInitializerPass(),
        Repeat([N.FoldConstantsPass(), N.InlineConstantIfPass(), N.SimplifyCastsPass(), N.IdentityEliminationPass(),
                N.MergeSlicesPass(), N.OptimizeTransposesPass(), N.CommonSubexpressionEliminationPass(), N.SimplifyReshapePass(),
                N.FoldShapeValuesPass(), N.DeadCodeEliminationPass()]),
        SymbolicShapesPass(),   # the passes below match on shapes ONNX's inference leaves unknown
        N.SimplifyCastsPass(), N.IdentityEliminationPass(),   # Casts to the type a value now has
        N.SimplifySoftmaxPass(),
        # fusions: change values by float32 rounding only (see each pass's docstring)
        N.FoldBatchNormPass(), N.FoldConvAffinePass(), N.FuseClipPass(), N.FuseHardSwishPass(), N.FuseLayerNormPass(),
        N.FuseGeluPass(), N.MatMulAddToGemmPass(),
        N.DeadCodeEliminationPass(),
    ]
    if layout == "nhwc":
        steps += [LayoutNhwcPass(), N.DeadCodeEliminationPass()]
    # identical weights become one, and then nodes that only differed by them merge
    after = [N.DeduplicateWeightsPass(), N.CommonSubexpressionEliminationPass(), N.DeadCodeEliminationPass()]
    if quantize is None:
        steps += after
    else:
        # weights deduplicated after quantizing: hashing the (smaller) quantized ones
        steps += [quantize_pass(quantize), *after]
    if target is not None:
        steps += target.legalize_passes()
    # last: every value's shape contract, over the final graph (decides the Triton dims)
    steps.append(SymbolicShapesPass())
    return steps


def named_pipeline(names: list[str]) -> list[Pass | Repeat]:
    """The passes the user listed with --passes, in that order."""
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise UsageError(f"unknown pass {', '.join(map(repr, unknown))}; known passes: "
                         f"{', '.join(sorted(PASSES))}")
    return [PASSES[n]() for n in names]


def build(target=None, options: PipelineOptions | None = None,  # noqa: ANN001 - targets.Target
          quantize: QuantizeOptions | None = None, calibration: list[dict] | None = None) -> PassManager:
    """The PassManager for a conversion: the default pipeline (or --passes), with its context."""
    o = options or PipelineOptions()
    for flag, names in (("--disable-pass", o.disabled), ("--print-ir-after", o.print_ir_after - {"all"}),
                        ("--explain-pass", o.explain)):
        unknown = sorted(set(names) - set(PASSES))
        if unknown:
            raise UsageError(f"{flag}: unknown pass {', '.join(map(repr, unknown))} "
                             f"(see `mcp-cli passes`)")
    from mcp_compiler.passes._rules import RuleSetPass

    plain = sorted(n for n in o.explain if not issubclass(PASSES[n], RuleSetPass))
    if plain:
        rule_sets = sorted(n for n, c in PASSES.items() if issubclass(c, RuleSetPass))
        raise UsageError(f"--explain-pass {plain[0]}: not a rule set, it has no candidate sites to explain "
                         f"(rule sets: {', '.join(rule_sets)})")
    if o.passes and o.layout == "nhwc" and "layout-nhwc" not in o.passes:
        raise UsageError("--layout nhwc with --passes: put layout-nhwc in the --passes list")
    steps = named_pipeline(o.passes) if o.passes else default_pipeline(target, quantize, o.opset, o.layout)
    ctx = PassContext(verify_each=o.verify_each, disabled=set(o.disabled), target=target,
                      quantize=quantize, calibration=calibration, min_opset=o.opset,
                      print_ir_after=set(o.print_ir_after), explain=set(o.explain), time_passes=o.time_passes)
    if o.fold_size_limit is not None:
        ctx.fold_size_limit = o.fold_size_limit
    return PassManager(steps, ctx)
