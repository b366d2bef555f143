"""Identical initializers become one."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from mcp_compiler.ir import Model
from mcp_compiler.ir.tensor import Tensor

from .._infra import ALL, Pass, PassContext, PassResult, Property

_CHUNK = 1 << 20
_PROBE = 4096        # bytes per sample of the fingerprint
_PROBES = 8          # samples spread over the tensor
_SMALL = 256         # bytes: tensors compared by their bytes, not through digests


class DeduplicateWeightsPass(Pass):
    """Initializers of one graph with equal dtype, dims and bytes -> the first of them; an
    initializer of a subgraph equal to one of a graph around it -> that one (an outer-scope
    reference, as ONNX allows).

    Not applied to initializers that are graph inputs or outputs (their names are interface).
    Only tensors with equal dtype and dims are compared; among those, a fingerprint of a few
    sampled 4 KiB pieces first, then SHA-256 of the whole bytes, then byte for byte. Bytes that are
    a view of a file are read with pread, not through the mapping: a model's weights are never
    all paged into the process (a 2 GB model stays at a few MB of RSS here).
    """

    name = "deduplicate-weights"
    requires = frozenset()
    establishes = frozenset({Property.UNIQUE_WEIGHTS})
    preserves = ALL - {Property.NO_DEAD_CODE}
    idempotent = True
    # the merged tensors are equal in dtype, dims and bytes: shapes and known contents stay
    keeps_fixed_points = frozenset({"infer-shapes"})

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        merged = saved = 0
        for g, outer in _scopes(model.graph, []):  # function bodies have no initializers
            for group in _candidates(g, outer):
                for keep, dup in _duplicates(group):
                    if g.initializers.get(dup.name) is not dup:
                        continue   # two outer ones: merged in their own graph
                    dup.replace_all_uses_with(keep)
                    del g.initializers[dup.name]
                    merged += 1
                    saved += dup.const.nbytes
        return PassResult(model, merged > 0, {"initializers_merged": merged, "bytes_saved": saved})


def _scopes(g, outer: list) -> Iterator[tuple]:  # noqa: ANN001 - ir.Graph
    """(graph, the initializers of the graphs around it that it may read), outer graphs first."""
    yield g, outer
    inner = [*outer, *_mergeable(g)]
    for n in g.nodes:
        for sub in n.subgraphs():
            yield from _scopes(sub, inner)


def _mergeable(g) -> list:  # noqa: ANN001 - ir.Graph
    interface = {id(v) for v in [*g.inputs, *g.outputs]}
    return [v for v in g.initializers.values() if id(v) not in interface]


def _candidates(g, outer: list = ()) -> list[list]:  # noqa: ANN001 - ir.Graph
    """The graph's initializers that may merge (after those of the graphs around it, which they
    may merge into), grouped by dtype and dims."""
    by_type: dict[tuple, list] = {}
    own = _mergeable(g)
    for v in [*outer, *own]:
        t = v.const
        if t.string_data is None:
            by_type.setdefault((int(t.dtype), t.dims), []).append(v)
    mine = {id(v) for v in own}
    return [group for group in by_type.values() if any(id(v) in mine for v in group)]


def duplicate_groups(g) -> list[list]:  # noqa: ANN001 - ir.Graph
    """Initializers of g that hold the same bytes (what the unique-weights property rules out)."""
    groups: dict[int, list] = {}
    for group in _candidates(g):
        for keep, dup in _duplicates(group):
            groups.setdefault(id(keep), [keep]).append(dup)
    return list(groups.values())


def _duplicates(group: list) -> Iterator[tuple]:
    """(first, later) pairs of equal tensors in a group of one dtype and shape, in order."""
    if len(group) < 2:
        return
    if group[0].const.nbytes <= _SMALL:
        # small tensors (one dtype and shape: all of one size): their bytes are the key
        first: dict[bytes, object] = {}
        for v in group:
            keep = first.setdefault(bytes(v.const.raw), v)
            if keep is not v:
                yield keep, v
        return
    by_print: dict[bytes, list] = {}
    for v in group:
        by_print.setdefault(_fingerprint(v.const), []).append(v)
    for same_print in by_print.values():
        if len(same_print) < 2:
            continue
        seen: dict[bytes, list] = {}
        for v in same_print:
            digest = _digest(v.const)
            keep = next((u for u in seen.get(digest, []) if _equal(u.const, v.const)), None)
            if keep is None:
                seen.setdefault(digest, []).append(v)
            else:
                yield keep, v


def _fingerprint(t: Tensor) -> bytes:
    n = t.nbytes
    starts = [0] if n <= _PROBE * _PROBES else [k * ((n - _PROBE) // (_PROBES - 1)) for k in range(_PROBES)]
    size = n if len(starts) == 1 else _PROBE
    h = hashlib.sha256()
    if t.source is not None:   # one open per tensor, pread per sample
        path, offset = t.source
        with open(path, "rb") as f:
            for start in starts:
                h.update(os.pread(f.fileno(), size, offset + start))
    else:
        raw = memoryview(t.raw).cast("B")
        for start in starts:
            h.update(raw[start:start + size])
    return h.digest()


def _pieces(t: Tensor) -> Iterator[bytes]:
    if t.source is None:
        raw = memoryview(t.raw).cast("B")
        for i in range(0, len(raw), _CHUNK):
            yield raw[i:i + _CHUNK]
        return
    path, offset = t.source
    with open(path, "rb") as f:
        for i in range(0, t.nbytes, _CHUNK):
            yield os.pread(f.fileno(), min(_CHUNK, t.nbytes - i), offset + i)


def _digest(t: Tensor) -> bytes:
    h = hashlib.sha256()
    for piece in _pieces(t):
        h.update(piece)
    return h.digest()


def _equal(a: Tensor, b: Tensor) -> bool:
    return all(x == y for x, y in zip(_pieces(a), _pieces(b)))
