"""Pass framework and passes (installed as mcp_compiler.passes).

`PASSES` is the one table of passes by name; nothing registers itself on import.
"""

from __future__ import annotations

from ._infra import (Pass, PassContext, PassError, PassManager, PassRecord, PassResult,
                     PipelineError, Property, Repeat)
from .layout import LayoutNhwcPass
from .normalize import (CommonSubexpressionEliminationPass, ConstantToInitializerPass,
                        DeadCodeEliminationPass, DeduplicateWeightsPass, FoldConstantsPass,
                        FoldBatchNormPass, FoldConvAffinePass, FuseGeluPass, FuseHardSwishPass,
                        FuseLayerNormPass, IdentityEliminationPass, MatMulAddToGemmPass, SimplifyReshapePass)
from .quantize import QuantizeFp8Pass, QuantizeInt4Pass
from .rewrite import LegalizePass, UpgradeOpsetPass
from .shapes import SymbolicShapesPass


def _table(*classes: type[Pass]) -> dict[str, type[Pass]]:
    table: dict[str, type[Pass]] = {}
    for c in classes:
        if c.name in table:
            raise ValueError(f"two passes named {c.name!r}")
        table[c.name] = c
    return table


PASSES: dict[str, type[Pass]] = _table(
    ConstantToInitializerPass, FoldConstantsPass, IdentityEliminationPass, CommonSubexpressionEliminationPass,
    DeadCodeEliminationPass, SimplifyReshapePass, FoldBatchNormPass, FoldConvAffinePass, FuseHardSwishPass,
    MatMulAddToGemmPass, FuseLayerNormPass, FuseGeluPass, DeduplicateWeightsPass, UpgradeOpsetPass, QuantizeInt4Pass, QuantizeFp8Pass,
    LegalizePass, SymbolicShapesPass, LayoutNhwcPass,
)

__all__ = ["PASSES", "Pass", "PassContext", "PassError", "PassManager", "PassRecord", "PassResult",
           "PipelineError", "Property", "Repeat"]
