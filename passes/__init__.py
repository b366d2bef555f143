"""Pass framework and passes (installed as mcp_compiler.passes).

`PASSES` is the one table of passes by name; nothing registers itself on import.
"""

from __future__ import annotations

from ._infra import (
    ALL,
    REWRITES,
    ContractError,
    Pass,
    PassContext,
    PassError,
    PassManager,
    PassRecord,
    PassResult,
    PipelineError,
    Property,
    Repeat,
)
from .layout import LayoutNhwcPass
from .normalize import (
    CommonSubexpressionEliminationPass,
    ConstantToInitializerPass,
    DeadCodeEliminationPass,
    DeduplicateWeightsPass,
    FoldBatchNormPass,
    FoldConstantsPass,
    FoldConvAffinePass,
    FoldShapeValuesPass,
    FuseClipPass,
    FuseGeluPass,
    FuseHardSwishPass,
    FuseLayerNormPass,
    IdentityEliminationPass,
    InlineConstantIfPass,
    MatMulAddToGemmPass,
    MergeSlicesPass,
    OptimizeTransposesPass,
    SimplifyCastsPass,
    SimplifyReshapePass,
    SimplifySoftmaxPass,
)
from .quantize import QuantizeFp8Pass, QuantizeHalfPass, QuantizeInt4Pass
from .rewrite import LegalizePass, UpgradeOpsetPass
from .shapes import SymbolicShapesPass


def _table(*classes: type[Pass]) -> dict[str, type[Pass]]:
    table: dict[str, type[Pass]] = {}
    for c in classes:
        if c.name in table:
            raise ValueError(f"two passes named {c.name!r}")
        table[c.name] = c
    return table


PASSES: dict[str, type[Pass]] = _table(   # in default-pipeline order (`mcp-cli passes` lists them so)
    UpgradeOpsetPass, ConstantToInitializerPass, FoldConstantsPass, FoldShapeValuesPass, InlineConstantIfPass, IdentityEliminationPass,
    SimplifyCastsPass, MergeSlicesPass, OptimizeTransposesPass,
    CommonSubexpressionEliminationPass, SimplifyReshapePass, DeadCodeEliminationPass, SymbolicShapesPass,
    SimplifySoftmaxPass, FoldBatchNormPass, FoldConvAffinePass, FuseClipPass, FuseHardSwishPass,
    FuseLayerNormPass, FuseGeluPass, MatMulAddToGemmPass, LayoutNhwcPass, DeduplicateWeightsPass,
    QuantizeInt4Pass, QuantizeFp8Pass, QuantizeHalfPass, LegalizePass,
)

__all__ = ["ALL", "PASSES", "REWRITES", "ContractError", "Pass", "PassContext", "PassError", "PassManager", "PassRecord", "PassResult",
           "PipelineError", "Property", "Repeat"]
