"""Quantization passes: INT4 weight-only (MatMulNBits or DequantizeLinear) and FP8 weights."""

from .options import QuantizeOptions
from .quantize_fp8 import MIN_OPSET as FP8_MIN_OPSET
from .quantize_fp8 import QuantizeFp8Pass
from .quantize_int4 import QuantizeInt4Pass

INT4_QDQ_MIN_OPSET = 21   # DequantizeLinear with int4 and block_size


def required_opset(opts: QuantizeOptions) -> int:
    """The ai.onnx opset the quantized model needs (0: any)."""
    if opts.mode == "fp8":
        return FP8_MIN_OPSET
    return INT4_QDQ_MIN_OPSET if opts.int4_format == "qdq" else 0


__all__ = ["QuantizeFp8Pass", "QuantizeInt4Pass", "QuantizeOptions", "required_opset"]
