"""Constant tensors: raw little-endian bytes held by reference (bytes, or a view of an mmap)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .types import DataType

# Where a tensor's bytes come from: anything numpy.frombuffer accepts without copying.
Buffer = bytes | bytearray | memoryview

# An integer (or bool) tensor this small is an operator's parameter (a shape, Slice bounds, axes,
# indices), not a weight: folding shape arithmetic and merging ops make such tensors by design.
PARAMETER_BYTES = 64
INTEGER_TYPES = frozenset({DataType.BOOL, DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64,
                           DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64})


class Tensor:
    """A constant: name, dtype, dims and its bytes in ONNX raw_data encoding.

    The bytes are never copied by the IR itself: a tensor read from a `.mcpir` holds a memoryview
    of the mapped file, one imported from ONNX holds the protobuf's bytes or a view of the
    external-data file.
    """

    __slots__ = ("name", "dtype", "dims", "_raw", "string_data", "doc_string", "metadata_props",
                 "source")

    def __init__(self, name: str, dtype: DataType | int, dims: Sequence[int], raw: Buffer | None = None,
                 *, string_data: Sequence[bytes] | None = None, doc_string: str = "",
                 metadata_props: dict[str, str] | None = None) -> None:
        self.name = name
        self.dtype = dtype if type(dtype) is DataType else DataType(dtype)
        self.dims = tuple([int(d) for d in dims])
        if self.dtype == DataType.STRING:
            if raw is not None:
                raise ValueError("STRING tensors hold string_data, not raw bytes")
            self.string_data = list(string_data or [])
        else:
            if string_data is not None:
                raise ValueError(f"{self.dtype.name} tensors hold raw bytes, not string_data")
            self.string_data = None
        self._raw = raw if raw is not None else (b"" if self.dtype != DataType.STRING else None)
        self.doc_string = doc_string
        self.metadata_props = dict(metadata_props or {})
        # (file, byte offset) the raw bytes are a view of, when they come straight from a file:
        # lets writers copy them in the kernel (copy_file_range) instead of through memory.
        self.source: tuple[str, int] | None = None

    @classmethod
    def from_numpy(cls, name: str, array: np.ndarray, dtype: DataType | None = None) -> Tensor:
        """A tensor holding a copy of `array` (sub-byte ml_dtypes arrays are packed)."""
        from onnx import helper, numpy_helper

        if dtype is None:
            dtype = DataType(helper.np_dtype_to_tensor_dtype(array.dtype))
        if dtype == DataType.STRING:
            return cls(name, dtype, array.shape,
                       string_data=[s if isinstance(s, bytes) else str(s).encode() for s in array.flat])
        if dtype.packed:
            raw = numpy_helper.from_array(array).raw_data
        else:
            raw = np.ascontiguousarray(array, dtype=dtype.numpy_dtype).astype(
                dtype.numpy_dtype.newbyteorder("<"), copy=False).tobytes()
        return cls(name, dtype, array.shape, raw)

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        """Bytes of the raw data (for STRING tensors: the sum of the string lengths)."""
        if self.string_data is not None:
            return sum(len(s) for s in self.string_data)
        raw = self._raw
        return len(raw) if type(raw) is bytes else memoryview(raw).nbytes   # (asked for often: no cast)

    @property
    def is_parameter(self) -> bool:
        """A small integer or bool tensor: an operator's parameter (PARAMETER_BYTES), not a weight."""
        return self.dtype in INTEGER_TYPES and self.nbytes <= PARAMETER_BYTES

    @property
    def raw(self) -> memoryview:
        """The raw bytes, as a memoryview (no copy)."""
        if self.string_data is not None:
            raise TypeError("STRING tensors have no raw bytes")
        return memoryview(self._raw).cast("B")

    def numpy(self) -> np.ndarray:
        """A read-only numpy view of the data (a copy only for sub-byte or big-endian hosts)."""
        if self.string_data is not None:
            return np.array(self.string_data, dtype=object).reshape(self.dims)
        if self.dtype.packed:
            from onnx import numpy_helper

            return numpy_helper.to_array(self.to_onnx_proto_header(raw=True))
        dt = self.dtype.numpy_dtype.newbyteorder("<")
        arr = np.frombuffer(self.raw, dtype=dt, count=self.numel)
        return arr.reshape(self.dims)

    def to_onnx_proto_header(self, raw: bool = False):  # noqa: ANN201 - onnx type
        """A TensorProto with this tensor's name/dtype/dims (and, with raw=True, a copy of its bytes)."""
        from onnx import TensorProto

        t = TensorProto(name=self.name, data_type=int(self.dtype), dims=self.dims,
                        doc_string=self.doc_string)
        if raw:
            t.raw_data = bytes(self.raw)
        return t

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.dtype.name}, {list(self.dims)})"


@dataclass
class SparseTensor:
    """ONNX SparseTensorProto: `values` (1-D) at `indices` of a tensor of shape `dims`."""

    values: Tensor
    indices: Tensor
    dims: tuple[int, ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return self.values.name
