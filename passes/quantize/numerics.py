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


INT4_METHODS = ("search", "rtn")
SHRINK = (1.0, 0.95, 0.9, 0.85)   # search: the fractions of each group's range tried
_CHUNK = 1 << 13                  # search: groups per step (keeps the temporaries in cache)


def quantize_int4(w: np.ndarray, block: int, symmetric: bool = False, method: str = "rtn",
                  importance: np.ndarray | None = None) -> Int4Blocks:
    """Group-wise INT4 of a [K, N] weight along K.

    rtn (round to nearest, onnxruntime's default and RTN): asymmetric maps the block's range
    [min(w, 0), max(w, 0)] onto 0..15 with an integer zero point; symmetric maps the value of
    largest magnitude onto -8 (so the other side reaches +7), zero point 8; the scale is then
    negative where that value is positive (legal for MatMulNBits and DequantizeLinear, and what
    onnxruntime's own quantizer does).

    search: per group, the range shrunk to each fraction in SHRINK (clipping the extremes), the
    values rounded with that scale and zero point, then the scale refitted by least squares for
    those integers; the candidate with the smallest squared error wins (RTN is the first
    candidate before its refit, so the error is never worse than the refitted RTN). With
    `importance` ([K], e.g. the mean square of the layer's input per channel, from calibration
    data) the error is weighted by it: what the layer's output loses, not the weight (AWQ's
    observation that a few input channels carry most of the output).

    `rel_error` (||w - dequantized|| / ||w||, unweighted) is computed on the way.
    """
    if method not in INT4_METHODS:
        raise ValueError(f"unknown int4 method {method!r}")
    k, n = w.shape
    blocks = -(-k // block)
    if k == blocks * block:
        b = np.ascontiguousarray(w.T, np.float32).reshape(n, blocks, block)
    else:
        wt = np.zeros((n, blocks * block), np.float32)
        wt[:, :k] = w.T
        b = wt.reshape(n, blocks, block)
    if method == "search":
        imp = None
        if importance is not None:
            iv = np.zeros(blocks * block, np.float32)
            iv[:k] = np.asarray(importance, np.float32).reshape(-1)[:k]
            # a channel never seen non-zero still counts a little: the samples are not all inputs
            iv += np.float32(max(float(iv.mean()), 1e-12) * 1e-3)
            imp = iv.reshape(blocks, block)
        scale, zp_f = _search(b.reshape(-1, block), imp, symmetric)
        scale, zp_f = scale.reshape(n, blocks), zp_f.reshape(n, blocks)
        x = _round(b, scale, zp_f, symmetric)
    elif symmetric:
        idx = np.abs(b).argmax(axis=-1)[..., None]
        extreme = np.take_along_axis(b, idx, axis=-1)[..., 0]
        scale = extreme / np.float32(-8.0)
        scale[scale == 0] = 1.0
        zp_f = np.full(scale.shape, 8, np.float32)
        x = _round(b, scale, zp_f, symmetric)
    else:
        lo = np.minimum(b.min(axis=-1), 0.0)
        hi = np.maximum(b.max(axis=-1), 0.0)
        scale = (hi - lo) / np.float32(15.0)
        scale[scale == 0] = 1.0
        zp_f = np.clip(np.rint(-lo / scale), 0, 15)
        x = _round(b, scale, zp_f, symmetric)
    q = x.astype(np.uint8)
    # the error, in place: x -> (x - zp) * scale - w
    x -= zp_f[..., None]
    x *= scale[..., None]
    x -= b
    return Int4Blocks(q, scale.astype(np.float32), zp_f.astype(np.uint8), k, symmetric,
                      relative_error(x, b))


def _round(b: np.ndarray, scale: np.ndarray, zp: np.ndarray, symmetric: bool) -> np.ndarray:
    """The integers 0..15 (as float32) for groups b [..., block] at scale and zero point."""
    x = b / scale[..., None]
    np.rint(x, out=x)
    if symmetric:
        np.clip(x, -8, 7, out=x)
        x += 8
    else:
        x += zp[..., None]
        np.clip(x, 0, 15, out=x)
    return x


def _search(groups: np.ndarray, importance: np.ndarray | None, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point per group [G, block] (see quantize_int4's `search`).
    `importance`: [blocks, block] weights, the groups being [N * blocks, block] row-major."""
    g_count, block = groups.shape
    scale = np.empty(g_count, np.float32)
    zp = np.empty(g_count, np.float32)
    nblocks = importance.shape[0] if importance is not None else 1
    for a in range(0, g_count, _CHUNK):
        x = groups[a:a + _CHUNK]
        wgt = None if importance is None else importance[np.arange(a, a + len(x)) % nblocks]
        if symmetric:
            idx = np.abs(x).argmax(axis=-1)[:, None]
            base = np.take_along_axis(x, idx, axis=-1)[:, 0] / np.float32(-8.0)
            z0 = np.full(len(x), 8, np.float32)
        else:
            lo = np.minimum(x.min(axis=-1), 0.0)
            span = np.maximum(x.max(axis=-1), 0.0) - lo
        best = None
        for t in SHRINK:
            s = base * np.float32(t) if symmetric else span * np.float32(t / 15.0)
            s = np.where(s == 0, np.float32(1.0), s)
            z = z0 if symmetric else np.clip(np.rint(-lo * np.float32(t) / s), 0, 15)
            q = _round(x, s, z, symmetric)
            q -= z[:, None]                                  # the signed integer each value becomes
            qw = q if wgt is None else q * wgt
            num, den = (qw * x).sum(axis=-1), (qw * q).sum(axis=-1)
            fit = np.where(den > 0, num / np.where(den > 0, den, 1), s).astype(np.float32)
            fit = np.where(fit == 0, s, fit)
            q *= fit[:, None]
            q -= x
            q *= q
            if wgt is not None:
                q *= wgt
            e = q.sum(axis=-1)
            if best is None:
                best, scale[a:a + len(x)], zp[a:a + len(x)] = e, fit, z
            else:
                better = e < best
                best = np.where(better, e, best)
                scale[a:a + len(x)] = np.where(better, fit, scale[a:a + len(x)])
                zp[a:a + len(x)] = np.where(better, z, zp[a:a + len(x)])
    return scale, zp


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
