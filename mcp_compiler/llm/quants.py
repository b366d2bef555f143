"""GGUF's block quantizations as onnxruntime's 4-bit blockwise weights (MatMulNBits), exactly.

GGML stores a weight of `N` rows by `K` columns row by row, each row as K/32 blocks; a block's
4-bit codes sit with element j in the low nibble of byte j and element j+16 in its high nibble.
MatMulNBits wants the same rows and blocks ([N, K/32, 16] bytes) with consecutive elements paired
in a byte (element 2i low, 2i+1 high), float32 scales [N, K/32] and packed uint8 zero points; it
dequantizes `(code - zero_point) * scale`. Each GGUF type becomes parts whose dequantized sum is
gguf's own dequantization, bit for bit (every term is exact in float32):

- Q4_0 `(q - 8) * d`: one part, zero point 8, scale d.
- Q4_1 `q * d + m`: one part, zero point 0, scale d (a 4-bit code times a float16 value is exact
  in float32), plus the block minimum `m` applied apart as `sum(a over the block) * m` (no uint8
  zero point gives `+ m`; a float one, -m/d, is 1 ulp off on 6% of the weights).
- Q8_0 `q * d` (q int8): u = q + 128 = 16 h + l, two parts: h with zero point 8 and scale 16 d,
  l with zero point 0 and scale d (onnxruntime 1.32's 8-bit MatMulNBits with float activations
  dequantizes the whole weight on every call: 300 ms for a 49152 x 576 LM head, 2.7 ms as 4 bits).

Scales and minimums are kept as GGUF has them, float16, and widened by a Cast in the graph
(exact; onnxruntime folds it when the session loads): the entry is about the GGUF's size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32
# bytes per block of 32 in GGUF, by GGML type name
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
QUANTIZED = tuple(BLOCK_BYTES)


@dataclass
class Part:
    """One 4-bit MatMulNBits weight [N, K]: (codes - zero_point) * (d * mult)."""

    codes: np.ndarray        # uint8 [N, K/32, 16], element 2i in the low nibble
    d: np.ndarray            # float16 [N, K/32]
    mult: float = 1.0        # a power of two: the scale is d * mult, exactly
    zero_point: int = 0

    def zero_points(self) -> np.ndarray:
        """MatMulNBits' packed uint8 zero points [N, ceil(K/32 / 2)]."""
        n, nb = self.d.shape
        return np.full((n, (nb + 1) // 2), self.zero_point * 17, np.uint8)

    def scales(self) -> np.ndarray:
        return (self.d.astype(np.float32) * np.float32(self.mult)).astype(np.float32)

    def dequantize(self) -> np.ndarray:
        q = unpack(self.codes).astype(np.float32)
        return (q - np.float32(self.zero_point)) * self.scales()[..., None]


@dataclass
class Blockwise:
    """A GGUF weight [N, K] as MatMulNBits parts, plus Q4_1's block minimums."""

    parts: list[Part]
    mins: np.ndarray | None = None   # float16 [N, K/32]

    @property
    def shape(self) -> tuple[int, int]:
        c = self.parts[0].codes
        return c.shape[0], c.shape[1] * BLOCK

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]: the parts dequantized as MatMulNBits does, summed, plus the minimums."""
        n, k = self.shape
        w = self.parts[0].dequantize()
        for p in self.parts[1:]:
            w = w + p.dequantize()
        if self.mins is not None:
            w = w + self.mins.astype(np.float32)[..., None]
        return w.reshape(n, k)


def concat_rows(ws: list[Blockwise]) -> Blockwise:
    """Weights of one type stacked along N (Q, K and V as one matmul)."""
    parts = [Part(np.concatenate([w.parts[i].codes for w in ws]), np.concatenate([w.parts[i].d for w in ws]),
                  ws[0].parts[i].mult, ws[0].parts[i].zero_point) for i in range(len(ws[0].parts))]
    mins = None if ws[0].mins is None else np.concatenate([w.mins for w in ws])
    return Blockwise(parts, mins)


def unpack(codes: np.ndarray) -> np.ndarray:
    """[.., 16] bytes -> [.., 32] codes, element 2i from the low nibble."""
    return np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)


def _pair(q: np.ndarray) -> np.ndarray:
    """codes [.., 32] (0..15) -> [.., 16] bytes, element 2i low, 2i+1 high."""
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _ggml_codes(qs: np.ndarray) -> np.ndarray:
    """GGML's 16 bytes of a block -> its 32 codes in element order."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def repack(ggml_type: str, raw: np.ndarray, n: int, k: int) -> Blockwise:
    """A GGUF tensor's bytes (rows of blocks) -> Blockwise. Raises ValueError on a size mismatch."""
    if k % BLOCK:
        raise ValueError(f"a row of {k} is not a whole number of {BLOCK}-element blocks")
    nb, size = k // BLOCK, BLOCK_BYTES[ggml_type]
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if raw.size != n * nb * size:
        raise ValueError(f"{raw.size} bytes where {n} x {k} {ggml_type} needs {n * nb * size}")
    blocks = raw.reshape(n, nb, size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if ggml_type == "Q8_0":
        u = (blocks[..., 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return Blockwise([Part(_pair(u >> 4), d, 16.0, 8), Part(_pair(u & 0x0F), d, 1.0, 0)])
    if ggml_type == "Q4_0":
        return Blockwise([Part(_pair(_ggml_codes(blocks[..., 2:])), d, 1.0, 8)])
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    return Blockwise([Part(_pair(_ggml_codes(blocks[..., 4:])), d, 1.0, 0)], mins=m)
