"""Element types and value types of the IR (numbering follows ONNX's TensorProto.DataType)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import ml_dtypes
import numpy as np

from .dims import Dim


class DataType(enum.IntEnum):
    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28

    @property
    def bits(self) -> int:
        """Storage bits of one element in raw (packed) form; 0 for STRING/UNDEFINED."""
        return _BITS[self]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype of one unpacked element (ml_dtypes for the small float/int types)."""
        try:
            return _NUMPY[self]
        except KeyError:
            raise TypeError(f"{self.name} has no numpy dtype") from None

    @property
    def packed(self) -> bool:
        """True for sub-byte types, stored several elements per byte."""
        return 0 < self.bits < 8

    def nbytes(self, numel: int) -> int:
        """Bytes that `numel` elements take in raw form."""
        return (numel * self.bits + 7) // 8


_BITS = {
    DataType.UNDEFINED: 0, DataType.STRING: 0,
    DataType.FLOAT: 32, DataType.UINT8: 8, DataType.INT8: 8, DataType.UINT16: 16,
    DataType.INT16: 16, DataType.INT32: 32, DataType.INT64: 64, DataType.BOOL: 8,
    DataType.FLOAT16: 16, DataType.DOUBLE: 64, DataType.UINT32: 32, DataType.UINT64: 64,
    DataType.COMPLEX64: 64, DataType.COMPLEX128: 128, DataType.BFLOAT16: 16,
    DataType.FLOAT8E4M3FN: 8, DataType.FLOAT8E4M3FNUZ: 8, DataType.FLOAT8E5M2: 8,
    DataType.FLOAT8E5M2FNUZ: 8, DataType.UINT4: 4, DataType.INT4: 4, DataType.FLOAT4E2M1: 4,
    DataType.FLOAT8E8M0: 8, DataType.UINT2: 2, DataType.INT2: 2, DataType.FLOAT6E2M3: 6,
    DataType.FLOAT6E3M2: 6,
}

_NUMPY: dict[DataType, np.dtype] = {
    DataType.FLOAT: np.dtype("float32"), DataType.UINT8: np.dtype("uint8"),
    DataType.INT8: np.dtype("int8"), DataType.UINT16: np.dtype("uint16"),
    DataType.INT16: np.dtype("int16"), DataType.INT32: np.dtype("int32"),
    DataType.INT64: np.dtype("int64"), DataType.BOOL: np.dtype("bool"),
    DataType.FLOAT16: np.dtype("float16"), DataType.DOUBLE: np.dtype("float64"),
    DataType.UINT32: np.dtype("uint32"), DataType.UINT64: np.dtype("uint64"),
    DataType.COMPLEX64: np.dtype("complex64"), DataType.COMPLEX128: np.dtype("complex128"),
    DataType.STRING: np.dtype(object),
    DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DataType.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    DataType.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DataType.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DataType.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DataType.UINT4: np.dtype(ml_dtypes.uint4), DataType.INT4: np.dtype(ml_dtypes.int4),
}
for _name, _dt in (("float4_e2m1fn", DataType.FLOAT4E2M1), ("float8_e8m0fnu", DataType.FLOAT8E8M0),
                   ("uint2", DataType.UINT2), ("int2", DataType.INT2),
                   ("float6_e2m3fn", DataType.FLOAT6E2M3), ("float6_e3m2fn", DataType.FLOAT6E3M2)):
    if hasattr(ml_dtypes, _name):  # newer ml_dtypes only
        _NUMPY[_dt] = np.dtype(getattr(ml_dtypes, _name))


# ---------------------------------------------------------------------------------------------
# Value types (ONNX TypeProto)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorType:
    """A (dense or sparse) tensor; `shape` None means the rank is unknown."""

    elem_type: DataType
    shape: tuple[Dim, ...] | None = None
    dim_denotations: tuple[str, ...] | None = None
    denotation: str = ""
    sparse: bool = False

    def __str__(self) -> str:
        kind = "sparse_tensor" if self.sparse else "tensor"
        dims = "?" if self.shape is None else ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{kind}({DataType(self.elem_type).name.lower()}[{dims}])"


@dataclass(frozen=True)
class SequenceType:
    elem: Type | None
    denotation: str = ""

    def __str__(self) -> str:
        return f"seq({self.elem})"


@dataclass(frozen=True)
class MapType:
    key_type: DataType
    value: Type | None
    denotation: str = ""

    def __str__(self) -> str:
        return f"map({DataType(self.key_type).name.lower()},{self.value})"


@dataclass(frozen=True)
class OptionalType:
    elem: Type | None
    denotation: str = ""

    def __str__(self) -> str:
        return f"optional({self.elem})"


@dataclass(frozen=True)
class NoType:
    """A TypeProto with no kind set (only a denotation, or nothing)."""

    denotation: str = ""

    def __str__(self) -> str:
        return "none"


Type = Union[TensorType, SequenceType, MapType, OptionalType, NoType]
