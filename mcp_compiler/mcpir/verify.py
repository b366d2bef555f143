"""Bounds-checks an MCP-IR FlatBuffer before any accessor touches it (stdlib only).

The Python flatbuffers runtime has no verifier, and `struct.unpack_from` happily follows negative
or huge offsets. This walks the buffer the way flatc's C++ verifier does, driven by the field
layout parsed from mcp_ir.fbs itself (one source of truth): every table, vtable, string and
vector must lie inside the buffer, required fields must be present, nesting is bounded, and the
number of objects is bounded by the buffer size (so shared or cyclic offsets cannot blow up).

This module imports nothing but the standard library: the serving runtime that model
repositories carry uses a copy of it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

_SCALARS = {"bool": 1, "byte": 1, "ubyte": 1, "int8": 1, "uint8": 1, "short": 2, "ushort": 2,
            "int16": 2, "uint16": 2, "int": 4, "uint": 4, "int32": 4, "uint32": 4, "float": 4,
            "long": 8, "ulong": 8, "int64": 8, "uint64": 8, "double": 8}

MAX_DEPTH = 512


class VerifyError(ValueError):
    """The buffer is not a well-formed MCP-IR FlatBuffer."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str          # "scalar", "string", "table", "struct", "vector"
    size: int = 0      # scalar/struct byte size; vector element size for inline elements
    elem: str = ""     # vector: "scalar", "struct", "string", "table"; table: the table name
    target: str = ""   # table name for table fields / vectors of tables
    required: bool = False


def parse_layout(schema: str) -> dict[str, list[FieldSpec]]:
    """Table name -> fields in vtable slot order, parsed from the text of mcp_ir.fbs."""
    text = re.sub(r"//[^\n]*", "", schema)
    enums = {m.group(1): _SCALARS[m.group(2)]
             for m in re.finditer(r"\benum\s+(\w+)\s*:\s*(\w+)", text)}
    blocks = {m.group(2): (m.group(1), m.group(3))
              for m in re.finditer(r"\b(table|struct)\s+(\w+)\s*\{([^}]*)\}", text)}
    field_re = re.compile(r"(\w+)\s*:\s*(\[?\s*\w+\s*\]?)\s*(?:=\s*[^;(]+)?\s*(\([^)]*\))?\s*;")

    def size_of(t: str) -> int:
        if t in _SCALARS:
            return _SCALARS[t]
        if t in enums:
            return enums[t]
        kind, body = blocks[t]
        if kind != "struct":
            raise ValueError(f"{t} is not a struct")
        return sum(size_of(ft) for _, ft, _ in field_re.findall(body))  # all fields 2-byte here

    def spec(name: str, t: str, attrs: str) -> FieldSpec:
        req = "required" in (attrs or "")
        t = t.replace(" ", "")
        if t.startswith("["):
            inner = t[1:-1]
            if inner == "string":
                return FieldSpec(name, "vector", 4, "string", required=req)
            if inner in _SCALARS or inner in enums:
                return FieldSpec(name, "vector", size_of(inner), "scalar", required=req)
            if blocks[inner][0] == "struct":
                return FieldSpec(name, "vector", size_of(inner), "struct", required=req)
            return FieldSpec(name, "vector", 4, "table", target=inner, required=req)
        if t == "string":
            return FieldSpec(name, "string", 4, required=req)
        if t in _SCALARS or t in enums:
            return FieldSpec(name, "scalar", size_of(t), required=req)
        if blocks[t][0] == "struct":
            return FieldSpec(name, "struct", size_of(t), required=req)
        return FieldSpec(name, "table", 4, target=t, required=req)

    return {name: [spec(*f) for f in field_re.findall(body)]
            for name, (kind, body) in blocks.items() if kind == "table"}


def verify_buffer(buf: bytes, layout: dict[str, list[FieldSpec]], root_table: str = "Model") -> None:
    """Raise VerifyError unless every object reachable from the root lies within `buf`."""
    size = len(buf)
    u32 = struct.Struct("<I").unpack_from
    i32 = struct.Struct("<i").unpack_from
    u16 = struct.Struct("<H").unpack_from
    budget = size // 4 + 16

    def bad(msg: str) -> VerifyError:
        return VerifyError(msg)

    def follow(at: int, what: str) -> int:
        if at < 0 or at + 4 > size:
            raise bad(f"{what}: offset field at {at} is outside the buffer")
        target = at + u32(buf, at)[0]
        if target + 4 > size:
            raise bad(f"{what}: points to {target}, past the end ({size} bytes)")
        return target

    if size < 8:
        raise bad("buffer too small")
    stack = [(root_table, follow(0, "root"), 0)]
    while stack:
        tname, pos, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise bad("more objects than the buffer can hold (shared or cyclic offsets)")
        if depth > MAX_DEPTH:
            raise bad(f"tables nested deeper than {MAX_DEPTH}")
        vt = pos - i32(buf, pos)[0]
        if vt < 0 or vt + 4 > size:
            raise bad(f"{tname} at {pos}: vtable at {vt} is outside the buffer")
        vt_size, tbl_size = u16(buf, vt)[0], u16(buf, vt + 2)[0]
        if vt_size < 4 or vt_size % 2 or vt + vt_size > size or tbl_size < 4 or pos + tbl_size > size:
            raise bad(f"{tname} at {pos}: bad vtable (size {vt_size}, table size {tbl_size})")
        for slot, f in enumerate(layout[tname]):
            vo_at = 4 + 2 * slot
            voff = u16(buf, vt + vo_at)[0] if vo_at < vt_size else 0
            if voff == 0:
                if f.required:
                    raise bad(f"{tname}.{f.name} is required but missing")
                continue
            if voff + f.size > tbl_size:
                raise bad(f"{tname}.{f.name} lies outside its table")
            at = pos + voff
            if f.kind in ("scalar", "struct"):
                continue
            target = follow(at, f"{tname}.{f.name}")
            if f.kind == "table":
                stack.append((f.target, target, depth + 1))
                continue
            n = u32(buf, target)[0]
            if f.kind == "string":
                if target + 4 + n + 1 > size:
                    raise bad(f"{tname}.{f.name}: string of {n} bytes runs past the end")
                continue
            if target + 4 + n * f.size > size:
                raise bad(f"{tname}.{f.name}: vector of {n} elements runs past the end")
            if f.elem in ("scalar", "struct"):
                continue
            if n > budget:
                raise bad(f"{tname}.{f.name}: vector of {n} objects is larger than the buffer allows")
            for k in range(n):
                elem_at = target + 4 + 4 * k
                t2 = follow(elem_at, f"{tname}.{f.name}[{k}]")
                if f.elem == "string":
                    ln = u32(buf, t2)[0]
                    if t2 + 4 + ln + 1 > size:
                        raise bad(f"{tname}.{f.name}[{k}]: string runs past the end")
                    budget -= 1
                else:
                    stack.append((f.target, t2, depth + 1))
