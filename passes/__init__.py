"""Pass framework and passes (installed as mcp_compiler.passes).

`PASSES` is the one table of passes by name; nothing registers itself on import.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

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
    WeightGrowth,
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
from .rewrite import LegalizePass, UpgradeOpsetPass
from .shapes import SymbolicShapesPass


class _PassTable(Mapping[str, "type[Pass]"]):
    """Pass classes by name, in the order given. An entry given as (name, "module:Class") is
    imported when it is first looked up: quantization's passes and numerics are not loaded by a
    conversion that does not quantize."""

    def __init__(self, *entries: type[Pass] | tuple[str, str]) -> None:
        self._entries: dict[str, type[Pass] | str] = {}
        for e in entries:
            name, where = e if isinstance(e, tuple) else (e.name, e)
            if name in self._entries:
                raise ValueError(f"two passes named {name!r}")
            self._entries[name] = where

    def __getitem__(self, name: str) -> type[Pass]:
        where = self._entries[name]
        if isinstance(where, str):
            module, _, cls = where.partition(":")
            where = self._entries[name] = getattr(importlib.import_module(module, __name__), cls)
            if where.name != name:
                raise ValueError(f"pass table: {name!r} names {cls}, whose name is {where.name!r}")
        return where

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


PASSES: Mapping[str, type[Pass]] = _PassTable(   # in default-pipeline order (`mcp-cli passes` lists them so)
    UpgradeOpsetPass, ConstantToInitializerPass, FoldConstantsPass, FoldShapeValuesPass, InlineConstantIfPass, IdentityEliminationPass,
    SimplifyCastsPass, MergeSlicesPass, OptimizeTransposesPass,
    CommonSubexpressionEliminationPass, SimplifyReshapePass, DeadCodeEliminationPass, SymbolicShapesPass,
    SimplifySoftmaxPass, FoldBatchNormPass, FoldConvAffinePass, FuseClipPass, FuseHardSwishPass,
    FuseLayerNormPass, FuseGeluPass, MatMulAddToGemmPass, LayoutNhwcPass, DeduplicateWeightsPass,
    ("quantize-int4", ".quantize:QuantizeInt4Pass"), ("quantize-fp8", ".quantize:QuantizeFp8Pass"),
    ("quantize-half", ".quantize:QuantizeHalfPass"), ("quantize-int8", ".quantize:QuantizeInt8Pass"),
    LegalizePass,
)

__all__ = ["ALL", "PASSES", "REWRITES", "ContractError", "Pass", "PassContext", "PassError", "PassManager", "PassRecord", "PassResult",
           "PipelineError", "Property", "Repeat", "WeightGrowth"]
