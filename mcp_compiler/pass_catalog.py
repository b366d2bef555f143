"""What `mcp-cli passes` lists, without importing the passes (numpy, onnx, onnxruntime).

Written from the pass table by `python -m mcp_compiler.pass_catalog` (tests/passes/test_catalog.py
fails when it differs from what the passes say of themselves).
"""

from __future__ import annotations

CATALOG: list[dict] = [{'name': 'upgrade-opset',
  'summary': "Raise the model's ai.onnx opset with onnx's version converter (weights never copied).",
  'requires': [],
  'establishes': []},
 {'name': 'constant-to-initializer',
  'summary': 'Constant nodes become initializers.',
  'requires': [],
  'establishes': ['no-constant-nodes']},
 {'name': 'fold-constants',
  'summary': 'Evaluate nodes whose inputs are all constants, once, with onnxruntime.',
  'requires': [],
  'establishes': []},
 {'name': 'fold-shape-values',
  'summary': 'Shape arithmetic on known dims -> constants (Shape -> Gather -> Unsqueeze -> Concat -> Reshape).',
  'requires': [],
  'establishes': []},
 {'name': 'inline-constant-if',
  'summary': 'An If whose condition is a constant becomes the branch it takes.',
  'requires': [],
  'establishes': []},
 {'name': 'identity-elimination', 'summary': 'Remove no-op nodes.', 'requires': [], 'establishes': []},
 {'name': 'simplify-casts',
  'summary': 'Cast chains: a Cast through a type that holds every value exactly is one Cast.',
  'requires': [],
  'establishes': []},
 {'name': 'merge-slices',
  'summary': 'Consecutive Slices over different axes are one Slice.',
  'requires': [],
  'establishes': []},
 {'name': 'optimize-transposes',
  'summary': 'Transposes move down through elementwise ops, and merge or cancel where they meet.',
  'requires': [],
  'establishes': []},
 {'name': 'common-subexpression-elimination',
  'summary': 'Merge nodes that compute the same thing.',
  'requires': [],
  'establishes': []},
 {'name': 'simplify-reshape',
  'summary': "Reshape shapes computed from the input's own shape -> constants; no-op Reshapes -> gone.",
  'requires': [],
  'establishes': []},
 {'name': 'dead-code-elimination',
  'summary': 'Remove nodes and initializers nothing uses.',
  'requires': [],
  'establishes': ['no-dead-code']},
 {'name': 'infer-shapes',
  'summary': "Symbolic shape inference: every value of the main graph gets a shape over the model's symbols.",
  'requires': [],
  'establishes': ['shapes-inferred']},
 {'name': 'simplify-softmax',
  'summary': "Undo the 2-D coercion around Softmax that onnx's version converter writes at opset 13.",
  'requires': ['shapes-inferred'],
  'establishes': []},
 {'name': 'fold-batchnorm',
  'summary': 'Fold inference BatchNormalization into the Conv, ConvTranspose or Gemm before it.',
  'requires': [],
  'establishes': []},
 {'name': 'fold-conv-affine',
  'summary': 'Fold per-channel constant Mul and Add after a Conv into its weight and bias.',
  'requires': [],
  'establishes': []},
 {'name': 'fuse-clip',
  'summary': 'Merge chains of clamping ops (Relu, Min/Max by a constant, Clip) into one Clip or Relu.',
  'requires': [],
  'establishes': []},
 {'name': 'fuse-hardswish',
  'summary': 'Fuse the exported hard-swish / hard-sigmoid arithmetic into HardSwish or HardSigmoid.',
  'requires': [],
  'establishes': []},
 {'name': 'fuse-layernorm',
  'summary': 'Fuse the exported layer-norm and RMS-norm arithmetic into LayerNormalization / RMSNormalization.',
  'requires': ['shapes-inferred'],
  'establishes': []},
 {'name': 'fuse-gelu',
  'summary': 'Fuse the exported GELU arithmetic (erf or tanh form) into Gelu (opset 20+).',
  'requires': [],
  'establishes': []},
 {'name': 'matmul-add-to-gemm',
  'summary': 'MatMul of a 2-D input by a constant, then Add of a constant bias -> Gemm.',
  'requires': ['shapes-inferred'],
  'establishes': []},
 {'name': 'layout-nhwc',
  'summary': 'NHWC interface: 4-D image inputs and outputs become channels-last; transposes move and cancel.',
  'requires': [],
  'establishes': ['layout-nhwc']},
 {'name': 'deduplicate-weights',
  'summary': 'Identical initializers become one.',
  'requires': [],
  'establishes': ['unique-weights']},
 {'name': 'quantize-int4',
  'summary': 'INT4 weight-only, group-wise quantization of constant MatMul/Gemm (and Conv) weights.',
  'requires': [],
  'establishes': []},
 {'name': 'quantize-fp8',
  'summary': 'FP8 weights (E4M3FN or E5M2) behind DequantizeLinear, with optional static activation Q/DQ.',
  'requires': [],
  'establishes': []},
 {'name': 'quantize-half',
  'summary': 'FP16 / BF16 weights: float32 constants stored in half precision, widened once at load.',
  'requires': [],
  'establishes': []},
 {'name': 'quantize-int8',
  'summary': 'INT8 static quantization (QDQ), calibrated on real samples, with the nodes whose int8 form',
  'requires': [],
  'establishes': []},
 {'name': 'legalize',
  'summary': 'Rewrite what the target runtime has no kernel for into what it has, exactly.',
  'requires': ['no-constant-nodes'],
  'establishes': []}]


def from_passes() -> list[dict]:
    """The catalogue as the passes themselves give it (imports every pass)."""
    import sys

    from .passes import PASSES

    return [{"name": n, "summary": (sys.modules[c.__module__].__doc__ or c.__doc__ or "").strip().splitlines()[0],
             "requires": sorted(p.value for p in c.requires),
             "establishes": sorted(p.value for p in c.establishes)} for n, c in PASSES.items()]


if __name__ == "__main__":   # rewrite this file from the passes
    import pprint
    from pathlib import Path

    path = Path(__file__)
    text = path.read_text()
    start = text.index("CATALOG: list[dict] = ")
    end = text.index("\n\n\ndef from_passes")
    path.write_text(text[:start] + "CATALOG: list[dict] = " + pprint.pformat(from_passes(), width=120, sort_dicts=False)
                    + text[end:])
