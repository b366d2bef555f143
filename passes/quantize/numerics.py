"""Quantization numerics on numpy arrays: INT4 blocks and FP8 scales (ml_dtypes for the types)."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

FP8_TYPES = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {"e4m3fn": 448.0, "e5m2": 57344.0}


@dataclass
class Int4Blocks:
    """W[K, N] quantized along K in blocks: w[k, n] ~ (q[n, b, i] - zp[n, b]) * scale[n, b],
    k = b * block + i (K padded with zeros to a whole number of blocks)."""

    q: np.ndarray            # uint8 [N, blocks, block], values 0..15 (symmetric: signed + 8)
    scale: np.ndarray        # float32 [N, blocks]
    zero_point: np.ndarray   # uint8 [N, blocks], values 0..15 (8 when symmetric)
    k: int
    symmetric: bool
    rel_error: float = float("nan")

    def dequantize(self) -> np.ndarray:
        """The [K, N] float32 weights the quantized ones stand for."""
        w = (self.q.astype(np.float32) - self.zero_point[..., None]) * self.scale[..., None]
        return w.reshape(w.shape[0], -1)[:, :self.k].T

    def packed(self) -> np.ndarray:
        """MatMulNBits' B: uint8 [N, blocks, block / 2], element 2i in the low nibble."""
        return self.q[..., 0::2] | (self.q[..., 1::2] << 4)

    def packed_zero_points(self) -> np.ndarray:
        """MatMulNBits' zero_points: uint8 [N * ceil(blocks / 2)], two per byte, low nibble first."""
        zp = self.zero_point
        if zp.shape[1] % 2:
            zp = np.concatenate([zp, np.zeros((zp.shape[0], 1), np.uint8)], axis=1)
        return (zp[:, 0::2] | (zp[:, 1::2] << 4)).reshape(-1)


def quantize_int4(w: np.ndarray, block: int, symmetric: bool = False) -> Int4Blocks:
    """Round-to-nearest group-wise INT4 of a [K, N] weight along K, with clipping.

    Asymmetric: the block's range [min(w, 0), max(w, 0)] maps onto 0..15 with an integer zero
    point. Symmetric: the value of largest magnitude maps onto -8 (so the other side reaches
    +7), zero point 8; the scale is then negative where that value is positive (legal
    for MatMulNBits and DequantizeLinear, and what onnxruntime's own quantizer does).
    `rel_error` (||w - dequantized|| / ||w||) is computed on the way, in the blocked layout.
    """
    k, n = w.shape
    blocks = -(-k // block)
    if k == blocks * block:
        b = np.ascontiguousarray(w.T, np.float32).reshape(n, blocks, block)
    else:
        wt = np.zeros((n, blocks * block), np.float32)
        wt[:, :k] = w.T
        b = wt.reshape(n, blocks, block)
    if symmetric:
        idx = np.abs(b).argmax(axis=-1)[..., None]
        extreme = np.take_along_axis(b, idx, axis=-1)[..., 0]
        scale = extreme / np.float32(-8.0)
        scale[scale == 0] = 1.0
        x = b / scale[..., None]
        np.rint(x, out=x)
        np.clip(x, -8, 7, out=x)
        x += 8
        zp_f = np.full(scale.shape, 8, np.float32)
    else:
        lo = np.minimum(b.min(axis=-1), 0.0)
        hi = np.maximum(b.max(axis=-1), 0.0)
        scale = (hi - lo) / np.float32(15.0)
        scale[scale == 0] = 1.0
        zp_f = np.clip(np.rint(-lo / scale), 0, 15)
        x = b / scale[..., None]
        np.rint(x, out=x)
        x += zp_f[..., None]
        np.clip(x, 0, 15, out=x)
    q = x.astype(np.uint8)
    # the error, in place: x -> (x - zp) * scale - w
    x -= zp_f[..., None]
    x *= scale[..., None]
    x -= b
    return Int4Blocks(q, scale.astype(np.float32), zp_f.astype(np.uint8), k, symmetric,
                      relative_error(x, b))


@dataclass
class Fp8Weights:
    q: np.ndarray       # ml_dtypes float8 array, same shape as the weight
    scale: np.ndarray   # float32 scalar (per tensor) or [channels] (per channel along `axis`)
    axis: int | None
    rel_error: float = float("nan")

    def dequantize(self) -> np.ndarray:
        s = self.scale
        if self.axis is not None:
            shape = [1] * self.q.ndim
            shape[self.axis] = -1
            s = s.reshape(shape)
        return self.q.astype(np.float32) * s


def quantize_fp8(w: np.ndarray, fmt: str = "e4m3fn", axis: int | None = None) -> Fp8Weights:
    """scale = max|w| / FP8_MAX (per tensor, or per slice along `axis`); q = w / scale rounded to
    the nearest float8 (ml_dtypes), clipped to the finite range first."""
    fmax = FP8_MAX[fmt]
    w = np.asarray(w, np.float32)
    if axis is None:
        amax = np.float32(np.abs(w).max()) if w.size else np.float32(0)
        scale = np.asarray(amax / fmax if amax > 0 else 1.0, np.float32)
        scaled = w / scale
    else:
        other = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.abs(w).max(axis=other)
        scale = np.where(amax > 0, amax / fmax, 1.0).astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        scaled = w / scale.reshape(shape)
    np.clip(scaled, -fmax, fmax, out=scaled)
    q = scaled.astype(FP8_TYPES[fmt])
    out = Fp8Weights(q, scale, axis)
    out.rel_error = relative_error(out.dequantize() - w, w)
    return out


def relative_error(diff: np.ndarray, w: np.ndarray) -> float:
    """||diff|| / ||w|| (Frobenius, float32 dot products); 0 for an all-zero w reproduced exactly."""
    d, ref = diff.reshape(-1), w.reshape(-1)
    err, norm = float(np.dot(d, d)), float(np.dot(ref, ref))
    return (err / norm) ** 0.5 if norm > 0 else (0.0 if err == 0 else float("inf"))
