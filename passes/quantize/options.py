"""What to quantize and how: the options --quantize and its companion flags set."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from mcp_compiler.errors import UsageError

MODES = ("int4", "fp8", "fp16", "bf16", "int8")
CALIBRATION_METHODS = ("auto", "minmax", "percentile", "entropy")
INT8_ACTIVATIONS = ("uint8", "int8")
INT4_METHODS = ("search", "rtn")
INT4_FORMATS = ("matmulnbits", "qdq")
BLOCK_SIZES = (16, 32, 64, 128, 256)


@dataclass
class QuantizeOptions:
    mode: str = "int4"                 # int4 | fp8 | fp16 | bf16
    int4_method: str = "search"        # int4: search (clipping search + least-squares scale) | rtn
    block_size: int = 32               # int4: weights per group along K
    symmetric: bool = False            # int4: no zero point (asymmetric by default)
    int4_format: str = "matmulnbits"   # int4 lowering: com.microsoft.MatMulNBits or DequantizeLinear(21)
    accuracy_level: int = 0            # MatMulNBits: 0 = float compute, 4 = int8 activations (faster)
    fp8_format: str = "e4m3fn"         # fp8: e4m3fn | e5m2
    per_channel: bool = True           # fp8: one scale per output channel (else one per tensor)
    conv: bool = False                 # also quantize constant Conv weights
    exclude: list[str] = field(default_factory=list)   # fnmatch patterns on node or weight names
    min_elements: int = 4096           # smaller weights are left in float
    max_error: float | None = None     # skip a layer whose relative weight error exceeds this
    calibration_method: str = "auto"   # int8: auto (minmax and percentile measured) | minmax | percentile | entropy
    int8_activations: str = "uint8"    # int8: the activations' type (uint8: VNNI's u8 x s8)
    search: bool = True                # int8: keep the nodes that break the budget in float (--auto-exclude)

    def validate(self) -> QuantizeOptions:
        if self.mode not in MODES:
            raise UsageError(f"--quantize: expected one of none, {', '.join(MODES)}, got {self.mode!r}")
        if self.block_size not in BLOCK_SIZES:
            raise UsageError(f"--group-size: expected one of {', '.join(map(str, BLOCK_SIZES))}, "
                             f"got {self.block_size}")
        if self.int4_method not in INT4_METHODS:
            raise UsageError(f"--int4-method: expected {' or '.join(INT4_METHODS)}, got {self.int4_method!r}")
        if self.int4_format not in INT4_FORMATS:
            raise UsageError(f"--int4-format: expected {' or '.join(INT4_FORMATS)}, got {self.int4_format!r}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise UsageError(f"--int4-accuracy-level: expected 0..4, got {self.accuracy_level}")
        if self.fp8_format not in ("e4m3fn", "e5m2"):
            raise UsageError(f"--fp8-format: expected e4m3fn or e5m2, got {self.fp8_format!r}")
        if self.calibration_method not in CALIBRATION_METHODS:
            raise UsageError(f"--calibration-method: expected one of {', '.join(CALIBRATION_METHODS)}, "
                             f"got {self.calibration_method!r}")
        if self.int8_activations not in INT8_ACTIVATIONS:
            raise UsageError(f"--int8-activations: expected uint8 or int8, got {self.int8_activations!r}")
        if self.min_elements < 0:
            raise UsageError(f"--quantize-min-elements must be >= 0, got {self.min_elements}")
        if self.max_error is not None and not self.max_error > 0:
            raise UsageError(f"--quantize-max-error must be > 0, got {self.max_error}")
        return self

    def excluded(self, *names: str) -> str | None:
        """The first exclusion pattern matching one of `names`, if any."""
        for pat in self.exclude:
            if any(n and fnmatch.fnmatchcase(n, pat) for n in names):
                return pat
        return None
