"""Normalization passes: semantics-preserving clean-ups every target gets."""

from .constant_to_initializer import ConstantToInitializerPass
from .cse import CommonSubexpressionEliminationPass
from .dead_code_elimination import DeadCodeEliminationPass
from .dedup_weights import DeduplicateWeightsPass
from .fold_batchnorm import FoldBatchNormPass
from .fold_constants import FoldConstantsPass
from .fold_conv_affine import FoldConvAffinePass
from .fold_shape_values import FoldShapeValuesPass
from .fuse_clip import FuseClipPass
from .fuse_gelu import FuseGeluPass
from .fuse_hardswish import FuseHardSwishPass
from .fuse_layernorm import FuseLayerNormPass
from .identity_elimination import IdentityEliminationPass
from .inline_constant_if import InlineConstantIfPass
from .matmul_add_to_gemm import MatMulAddToGemmPass
from .merge_slices import MergeSlicesPass
from .optimize_transposes import OptimizeTransposesPass
from .simplify_casts import SimplifyCastsPass
from .simplify_reshape import SimplifyReshapePass
from .simplify_softmax import SimplifySoftmaxPass

__all__ = ["CommonSubexpressionEliminationPass", "ConstantToInitializerPass", "DeadCodeEliminationPass",
           "DeduplicateWeightsPass", "FoldBatchNormPass", "FoldConstantsPass", "FoldConvAffinePass",
           "FoldShapeValuesPass", "FuseClipPass", "FuseGeluPass", "FuseHardSwishPass", "FuseLayerNormPass",
           "IdentityEliminationPass", "InlineConstantIfPass", "MatMulAddToGemmPass", "MergeSlicesPass", "OptimizeTransposesPass", "SimplifyCastsPass",
           "SimplifyReshapePass", "SimplifySoftmaxPass"]
