"""Quantization passes: INT4 weight-only (MatMulNBits or DequantizeLinear), FP8 weights, FP16/BF16 weights,
INT8 static QDQ (calibrated weights and activations)."""

from .options import QuantizeOptions
from .quantize_fp8 import MIN_OPSET as FP8_MIN_OPSET
from .quantize_fp8 import QuantizeFp8Pass
from .quantize_half import BF16_MIN_OPSET, QuantizeHalfPass
from .quantize_int4 import QuantizeInt4Pass
from .quantize_int8 import MIN_OPSET as INT8_MIN_OPSET
from .quantize_int8 import QuantizeInt8Pass

INT4_QDQ_MIN_OPSET = 21   # DequantizeLinear with int4 and block_size


def required_opset(opts: QuantizeOptions) -> int:
    """The ai.onnx opset the quantized model needs (0: any)."""
    if opts.mode == "fp8":
        return FP8_MIN_OPSET
    if opts.mode == "bf16":
        return BF16_MIN_OPSET
    if opts.mode == "fp16":
        return 0
    if opts.mode == "int8":
        return INT8_MIN_OPSET
    return INT4_QDQ_MIN_OPSET if opts.int4_format == "qdq" else 0


def quantize_pass(opts: QuantizeOptions):  # noqa: ANN201 - a Pass
    """The pass for --quantize MODE."""
    return {"int4": QuantizeInt4Pass, "fp8": QuantizeFp8Pass, "int8": QuantizeInt8Pass}.get(opts.mode, QuantizeHalfPass)()


__all__ = ["QuantizeFp8Pass", "QuantizeHalfPass", "QuantizeInt4Pass", "QuantizeInt8Pass", "QuantizeOptions", "quantize_pass",
           "required_opset"]
