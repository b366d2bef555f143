"""Normalization passes: semantics-preserving clean-ups every target gets."""

from .constant_to_initializer import ConstantToInitializerPass
from .cse import CommonSubexpressionEliminationPass
from .dead_code_elimination import DeadCodeEliminationPass
from .dedup_weights import DeduplicateWeightsPass
from .fold_constants import FoldConstantsPass
from .identity_elimination import IdentityEliminationPass

__all__ = ["CommonSubexpressionEliminationPass", "ConstantToInitializerPass",
           "DeadCodeEliminationPass", "DeduplicateWeightsPass", "FoldConstantsPass",
           "IdentityEliminationPass"]
