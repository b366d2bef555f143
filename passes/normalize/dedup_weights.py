"""Identical initializers become one."""

from __future__ import annotations

import hashlib

from mcp_compiler.ir import Model

from .._infra import Pass, PassContext, PassResult


class DeduplicateWeightsPass(Pass):
    """Initializers of one graph with equal dtype, dims and bytes -> the first of them.

    Not applied to initializers that are graph inputs or outputs (their names are interface).
    Compared by SHA-256 of the bytes, then byte for byte.
    """

    name = "deduplicate-weights"

    def run(self, model: Model, ctx: PassContext) -> PassResult:
        merged = saved = 0
        for g in model.graph.graphs():  # function bodies have no initializers
            interface = {id(v) for v in [*g.inputs, *g.outputs]}
            seen: dict[tuple, list] = {}
            for name, v in list(g.initializers.items()):
                t = v.const
                if id(v) in interface or t.string_data is not None:
                    continue
                raw = t.raw
                key = (int(t.dtype), t.dims, hashlib.sha256(raw).digest())
                same = next((u for u in seen.get(key, []) if u.const.raw == raw), None)
                if same is None:
                    seen.setdefault(key, []).append(v)
                    continue
                v.replace_all_uses_with(same)
                del g.initializers[name]
                merged += 1
                saved += t.nbytes
        return PassResult(model, merged > 0, {"initializers_merged": merged, "bytes_saved": saved})
