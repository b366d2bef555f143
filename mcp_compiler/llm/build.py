"""A GGUF decoder as an ONNX decoder with Optimum's interface and its KV cache as inputs/outputs.

Inputs `input_ids`, `attention_mask` and `past_key_values.N.key/value`
[batch, kv_heads, past, head_size]; outputs `logits` and `present.N.key/value`. The layers are
onnxruntime's fused ops, as onnxruntime-genai's builder makes them (SkipSimplifiedLayerNormalization,
GroupQueryAttention with the rotary inside): the cache is "packed", as GroupQueryAttention keeps
it: a row's cached tokens start at 0, its attention mask is ones for its cached and new tokens
then zeros, and its new tokens' K/V land right after its own cached ones in `present` (so rows of
different lengths run in one step; positions are each row's cache length onwards, as the
rotary inside GroupQueryAttention counts them: no `position_ids`, as onnxruntime-genai's models).
`fused=False` builds Optimum's plain graph instead, as torch exports it: `position_ids` given, the
cache "padded" (present = past then the new tokens; a row's unused cache slots masked out).

Weights stay as GGUF stored them (quants.py: MatMulNBits, the embedding gathered from the same
codes); `dequantized=True` builds the float32 reference, every weight dequantized by gguf's own
code. With `last_logits` the graph takes `logits_index` [batch] (the position in each row whose
logits are wanted) and gives logits [batch, 1, vocab]: a prompt's prefill pays the LM head for one
position, not for every one.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .gguf_file import DENSE, GGUFModel, GGUFTensor
from .quants import BLOCK, Blockwise, concat_rows, repack

OPSET = 18
MS = "com.microsoft"
# accuracy_level of MatMulNBits: 0 keeps float32 activations (the float reference's numbers);
# 4 quantizes activations to int8 per block (faster, as llama.cpp computes)
ACCURACY_FLOAT, ACCURACY_INT8 = 0, 4
_NEG = float(np.finfo(np.float32).min)


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def const(self, value: np.ndarray, base: str = "c") -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", base: str | None = None,
           **attrs: object) -> str | list[str]:
        outs = [self.name(base or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs


class DecoderBuilder:
    def __init__(self, gm: GGUFModel, *, dequantized: bool = False, last_logits: bool = False,
                 accuracy_level: int = ACCURACY_FLOAT, fused: bool = True) -> None:
        self.gm, self.spec, self.g = gm, gm.spec, _Graph()
        self.fused = fused
        self.dequantized, self.last_logits, self.accuracy = dequantized, last_logits, accuracy_level

    # -- weights ------------------------------------------------------------------------------
    def _float(self, t: GGUFTensor) -> np.ndarray:
        if t.type in DENSE:
            return np.asarray(t.data, dtype=np.float32).reshape(t.shape)
        from gguf import GGMLQuantizationType, dequantize

        return dequantize(t.data, GGMLQuantizationType[t.type]).astype(np.float32).reshape(t.shape)

    def _blockwise(self, names: list[str]) -> Blockwise | None:
        ts = [self.gm.tensors[n] for n in names]
        if self.dequantized or ts[0].type in DENSE:
            return None
        return concat_rows([repack(t.type, t.data, *t.shape) for t in ts])

    def linear(self, x: str, names: list[str], k: int) -> str:
        """x [.., K] @ W^T for the rows of `names` stacked (one matmul for Q, K and V)."""
        g = self.g
        types = {self.gm.tensors[n].type for n in names}
        if len(names) > 1 and len(types) > 1 and not self.dequantized:   # each in its own form
            return g.op("Concat", [self.linear(x, [n], k) for n in names], axis=-1)
        w = self._blockwise(names)
        if w is None:
            dense = np.concatenate([self._float(self.gm.tensors[n]) for n in names])
            return g.op("MatMul", [x, g.const(np.ascontiguousarray(dense.T), "w")])
        return self.nbits(x, self.stored(w, "w"), w, k)

    def stored(self, w: Blockwise, base: str) -> dict:
        """The weight's constants: per part (codes, float16 d, zero points), and the minimums."""
        g = self.g
        parts = [(g.const(p.codes, f"{base}_q"), g.const(p.d, f"{base}_d"), g.const(p.zero_points(), f"{base}_zp"))
                 for p in w.parts]
        mins = None if w.mins is None else g.const(np.ascontiguousarray(w.mins.T), f"{base}_min")
        return {"parts": parts, "mins": mins}

    def scale(self, d: str, mult: float) -> str:
        """float16 d -> float32 d * mult (exact; onnxruntime folds it at load)."""
        g = self.g
        f = g.op("Cast", [d], to=TensorProto.FLOAT)
        return f if mult == 1.0 else g.op("Mul", [f, g.const(np.array(mult, np.float32))])

    def nbits(self, x: str, names: dict, w: Blockwise, k: int) -> str:
        g = self.g
        y = None
        for (codes, d, zp), p in zip(names["parts"], w.parts):
            part = g.op("MatMulNBits", [x, codes, self.scale(d, p.mult), zp], domain=MS, K=k, N=p.codes.shape[0],
                        bits=4, block_size=BLOCK, accuracy_level=self.accuracy)
            y = part if y is None else g.op("Add", [y, part])
        if names["mins"] is None:
            return y
        # Q4_1's block minimum m: sum over the block of x, times m (exactly q*d + m per weight)
        blocks = g.op("Reshape", [x, g.const(np.array([0, 0, k // BLOCK, BLOCK], np.int64))])
        sums = g.op("ReduceSum", [blocks, g.const(np.array([-1], np.int64))], keepdims=0)
        return g.op("Add", [y, g.op("MatMul", [sums, g.op("Cast", [names["mins"]], to=TensorProto.FLOAT)])])

    def embedding(self, ids: str) -> tuple[str, Blockwise | None]:
        """The token embedding, gathered from the codes the tied LM head also reads (stored once)."""
        g, t = self.g, self.gm.tensors["token_embd.weight"]
        w = None if self.dequantized or t.type in DENSE else repack(t.type, t.data, *t.shape)
        if w is None:
            self._table = g.const(self._float(t), "token_embd")
            return g.op("Gather", [self._table, ids]), None
        self._embd = self.stored(w, "embd")
        axis = g.const(np.array([-1], np.int64))
        x = None
        for (codes, d, _), p in zip(self._embd["parts"], w.parts):
            c = g.op("Gather", [codes, ids])                                    # [B, S, nb, 16]
            lo = g.op("BitwiseAnd", [c, g.const(np.array(15, np.uint8))])
            hi = g.op("BitShift", [c, g.const(np.array(4, np.uint8))], direction="RIGHT")
            pair = g.op("Concat", [g.op("Unsqueeze", [lo, axis]), g.op("Unsqueeze", [hi, axis])], axis=-1)
            q = g.op("Cast", [g.op("Reshape", [pair, g.const(np.array([0, 0, 0, BLOCK], np.int64))])], to=TensorProto.FLOAT)
            if p.zero_point:
                q = g.op("Sub", [q, g.const(np.array(p.zero_point, np.float32))])
            scale = g.op("Unsqueeze", [g.op("Gather", [self.scale(d, p.mult), ids]), axis])
            term = g.op("Mul", [scale, q])    # d * q, as gguf's dequantizer multiplies
            x = term if x is None else g.op("Add", [x, term])
        if w.mins is not None:   # stored [nb, N] for the LM head: gathered along axis 1
            m = g.op("Cast", [self._embd["mins"]], to=TensorProto.FLOAT)
            m = g.op("Transpose", [g.op("Gather", [m, ids], axis=1)], perm=[1, 2, 0])   # [B, S, nb]
            x = g.op("Add", [x, g.op("Unsqueeze", [m, axis])])
        return g.op("Reshape", [x, g.const(np.array([0, 0, self.spec.hidden], np.int64))]), w

    def rms_norm(self, x: str, weight: str, skip: str | None = None) -> tuple[str, str]:
        """RMSNorm of x (of x + skip, the residual stream, when given): (normed, the sum)."""
        g = self.g
        w = g.const(self._float(self.gm.tensors[weight]), "norm")
        if skip is None:   # the first norm: plain ops (SimplifiedLayerNormalization is not in ONNX's checker)
            var = g.op("ReduceMean", [g.op("Mul", [x, x]), g.const(np.array([-1], np.int64))], keepdims=1)
            inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, g.const(np.array(self.spec.rms_eps, np.float32))])])])
            return g.op("Mul", [g.op("Mul", [x, inv]), w]), x
        out = g.op("SkipSimplifiedLayerNormalization", [x, skip, w], n_out=4, domain=MS, epsilon=self.spec.rms_eps)
        return out[0], out[3]

    # -- the graph ----------------------------------------------------------------------------
    def rope_freqs(self) -> np.ndarray:
        """position x inv_freq [context, head_size / 2], as transformers computes them: inv_freq
        in float32, position * inv_freq in float32 (Llama-3's rope_freqs and linear scaling applied)."""
        s = self.spec
        inv = (1.0 / (np.float32(s.rope_base) ** (np.arange(0, s.head_size, 2, dtype=np.int64).astype(np.float32)
                                                  / np.float32(s.head_size)))).astype(np.float32)
        if self.gm.rope_freqs is not None:
            inv = (inv / self.gm.rope_freqs).astype(np.float32)
        pos = (np.arange(s.context, dtype=np.float32) / np.float32(s.rope_scale)).astype(np.float32)
        return np.outer(pos, inv).astype(np.float32)

    def rope_cache(self) -> tuple[str, str]:
        """cos and sin [context, head_size / 2] for GroupQueryAttention's rotary."""
        freqs, g = self.rope_freqs(), self.g
        return g.const(np.cos(freqs).astype(np.float32), "rope_cos"), g.const(np.sin(freqs).astype(np.float32), "rope_sin")

    def cache_lengths(self, mask: str) -> tuple[str, str]:
        """GroupQueryAttention's seqlens_k (each row's tokens minus one: its mask's ones, which
        start at 0 and run unbroken) and total_sequence_length (the mask's width)."""
        g = self.g
        ones = g.op("ReduceSum", [mask, g.const(np.array([1], np.int64))], keepdims=0)
        seqlens = g.op("Cast", [g.op("Sub", [ones, g.const(np.array(1, np.int64))])], to=TensorProto.INT32)
        width = g.op("Gather", [g.op("Shape", [mask]), g.const(np.array(1, np.int64))])
        return seqlens, g.op("Cast", [width], to=TensorProto.INT32)

    def layer(self, i: int, x: str, h: str, rope: tuple[str, str], lengths: tuple[str, str]) -> tuple[str, str]:
        """x: the residual stream, h: its attention norm -> (the stream after the layer's
        attention, its FFN's output): the next norm adds them."""
        s, g = self.spec, self.g
        b = f"blk.{i}."
        qkv = self.linear(h, [b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"], s.hidden)
        if s.qkv_bias:
            bias_qkv = np.concatenate([self._float(self.gm.tensors[b + n]) for n in ("attn_q.bias", "attn_k.bias", "attn_v.bias")])
            qkv = g.op("Add", [qkv, g.const(bias_qkv, "qkv_bias")])
        # packed Q|K|V; rotary (each row's positions from its own cache length), the cache, the
        # causal softmax, grouped-query heads without repeating K/V: one fused op
        ctx, pk, pv = g.op("GroupQueryAttention", [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                                                   *lengths, *rope], n_out=3, domain=MS, num_heads=s.heads,
                           kv_num_heads=s.kv_heads, do_rotary=1, rotary_interleaved=int(s.rope == "interleaved"))
        self._present += [(pk, f"present.{i}.key"), (pv, f"present.{i}.value")]
        attn = self.linear(ctx, [b + "attn_output.weight"], s.hidden)
        h, x = self.rms_norm(attn, b + "ffn_norm.weight", skip=x)
        gate, up = g.op("Split", [self.linear(h, [b + "ffn_gate.weight", b + "ffn_up.weight"], s.hidden),
                                  g.const(np.array([s.ffn, s.ffn], np.int64))], n_out=2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        return x, self.linear(act, [b + "ffn_down.weight"], s.ffn)

    # -- Optimum's plain graph (padded cache, position_ids): what torch exports -----------------
    def _rope_tables(self, positions: str) -> tuple[str, str]:
        s, g = self.spec, self.g
        half = s.head_size // 2
        freqs = self.rope_freqs()
        axis = [1, -1] if s.rope == "interleaved" else [1]
        out = []
        for table in (np.cos(freqs), np.sin(freqs)):
            got = g.op("Gather", [g.const(table.astype(np.float32).reshape(s.context, half), "rope"), positions])
            out.append(g.op("Unsqueeze", [got, g.const(np.array(axis, np.int64))]))
        return out[0], out[1]

    def _rotate(self, x: str, cos: str, sin: str) -> str:
        """x [B, h, S, hd]: GGML's NORM rotary (pairs 2i, 2i+1) or NEOX's (i, i + hd/2)."""
        s, g = self.spec, self.g
        half = s.head_size // 2
        if s.rope == "interleaved":
            xr = g.op("Reshape", [x, g.const(np.array([0, 0, 0, half, 2], np.int64))])
            x0, x1 = g.op("Split", [xr, g.const(np.array([1, 1], np.int64))], n_out=2, axis=-1)
        else:
            x0, x1 = g.op("Split", [x, g.const(np.array([half, half], np.int64))], n_out=2, axis=-1)
        y0 = g.op("Sub", [g.op("Mul", [x0, cos]), g.op("Mul", [x1, sin])])
        y1 = g.op("Add", [g.op("Mul", [x1, cos]), g.op("Mul", [x0, sin])])
        y = g.op("Concat", [y0, y1], axis=-1)
        if s.rope == "interleaved":
            y = g.op("Reshape", [y, g.const(np.array([0, 0, 0, s.head_size], np.int64))])
        return y

    def _attention_bias(self, mask: str, ids: str) -> str:
        """[B, 1, groups * S, T]: 0 where row s may see key t (t <= T - S + s and mask[t] = 1)."""
        g, s = self.g, self.spec
        i64 = lambda v: g.const(np.array(v, np.int64))  # noqa: E731
        total = g.op("Gather", [g.op("Shape", [mask]), i64(1)])
        seq = g.op("Gather", [g.op("Shape", [ids]), i64(1)])
        keys = g.op("Range", [i64(0), total, i64(1)])
        rows = g.op("Add", [g.op("Range", [i64(0), seq, i64(1)]), g.op("Sub", [total, seq])])
        causal = g.op("LessOrEqual", [g.op("Unsqueeze", [keys, i64([0])]), g.op("Unsqueeze", [rows, i64([1])])])
        pad = g.op("Unsqueeze", [g.op("Equal", [mask, i64(1)]), i64([1, 2])])
        bias = g.op("Where", [g.op("And", [causal, pad]), g.const(np.array(0.0, np.float32)),
                              g.const(np.array(_NEG, np.float32))])
        groups = s.heads // s.kv_heads
        return bias if groups == 1 else g.op("Concat", [bias] * groups, axis=2)

    def _plain_layer(self, i: int, x: str, cos: str, sin: str, bias: str) -> str:
        s, g = self.spec, self.g
        b = f"blk.{i}."
        kv = s.kv_heads * s.head_size
        h, _ = self.rms_norm(x, b + "attn_norm.weight")
        qkv = self.linear(h, [b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"], s.hidden)
        if s.qkv_bias:
            bias_qkv = np.concatenate([self._float(self.gm.tensors[b + n]) for n in ("attn_q.bias", "attn_k.bias", "attn_v.bias")])
            qkv = g.op("Add", [qkv, g.const(bias_qkv, "qkv_bias")])
        q, k, v = g.op("Split", [qkv, g.const(np.array([s.hidden, kv, kv], np.int64))], n_out=3, axis=-1)

        def heads(t: str, n: int) -> str:
            r = g.op("Reshape", [t, g.const(np.array([0, 0, n, s.head_size], np.int64))])
            return g.op("Transpose", [r], perm=[0, 2, 1, 3])

        q = self._rotate(heads(q, s.heads), cos, sin)
        k = self._rotate(heads(k, s.kv_heads), cos, sin)
        v = heads(v, s.kv_heads)
        pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        k_all = g.op("Concat", [pk, k], axis=2, base=f"present.{i}.key")
        v_all = g.op("Concat", [pv, v], axis=2, base=f"present.{i}.value")
        self._present += [(k_all, f"present.{i}.key"), (v_all, f"present.{i}.value")]
        # grouped-query attention without repeating K/V: the groups of a KV head as more rows
        qg = g.op("Reshape", [q, g.const(np.array([0, s.kv_heads, -1, s.head_size], np.int64))])
        scores = g.op("MatMul", [qg, g.op("Transpose", [k_all], perm=[0, 1, 3, 2])])
        scores = g.op("Add", [g.op("Mul", [scores, g.const(np.array(1.0 / np.sqrt(s.head_size), np.float32))]), bias])
        ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v_all])          # [B, kvh, g*S, hd]
        ctx = g.op("Reshape", [ctx, g.const(np.array([0, s.heads, -1, s.head_size], np.int64))])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.const(np.array([0, 0, s.hidden], np.int64))])
        x = g.op("Add", [x, self.linear(ctx, [b + "attn_output.weight"], s.hidden)])
        h, _ = self.rms_norm(x, b + "ffn_norm.weight")
        gate, up = g.op("Split", [self.linear(h, [b + "ffn_gate.weight", b + "ffn_up.weight"], s.hidden),
                                  g.const(np.array([s.ffn, s.ffn], np.int64))], n_out=2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        return g.op("Add", [x, self.linear(act, [b + "ffn_down.weight"], s.ffn)])

    def build(self) -> onnx.ModelProto:
        s, g = self.spec, self.g
        x, embd = self.embedding("input_ids")
        self._present: list[tuple[str, str]] = []
        if self.fused:
            rope, lengths = self.rope_cache(), self.cache_lengths("attention_mask")
            h, _ = self.rms_norm(x, "blk.0.attn_norm.weight")
            for i in range(s.layers):
                x, ffn = self.layer(i, x, h, rope, lengths)
                norm = f"blk.{i + 1}.attn_norm.weight" if i + 1 < s.layers else "output_norm.weight"
                h, x = self.rms_norm(ffn, norm, skip=x)
        else:
            cos, sin = self._rope_tables("position_ids")
            bias = self._attention_bias("attention_mask", "input_ids")
            for i in range(s.layers):
                x = self._plain_layer(i, x, cos, sin, bias)
            h, _ = self.rms_norm(x, "output_norm.weight")
        if self.last_logits:   # [B, S, H] -> the row's one position [B, 1, H]
            idx = g.op("Unsqueeze", ["logits_index", g.const(np.array([1, 2], np.int64))])
            idx = g.op("Expand", [idx, g.const(np.array([1, 1, s.hidden], np.int64))])
            h = g.op("GatherElements", [h, idx], axis=1)
        head = "output.weight" if not s.tied else "token_embd.weight"
        logits = self._lm_head(h, head, embd)
        return self._model(logits, self._present)

    def _lm_head(self, x: str, head: str, embd: Blockwise | None) -> str:
        g = self.g
        if self.spec.tied and embd is not None:   # the embedding's own codes: stored once
            return self.nbits(x, self._embd, embd, self.spec.hidden)
        if self.spec.tied and self.dequantized:
            return g.op("MatMul", [x, g.op("Transpose", [self._table], perm=[1, 0])])
        return self.linear(x, [head], self.spec.hidden)

    def _model(self, logits: str, present: list[tuple[str, str]]) -> onnx.ModelProto:
        s, g = self.spec, self.g
        rename = {logits: "logits", **dict(present)}
        for node in g.nodes:   # the graph's outputs under their interface names
            node.input[:] = [rename.get(o, o) for o in node.input]
            node.output[:] = [rename.get(o, o) for o in node.output]
        f, i64 = TensorProto.FLOAT, TensorProto.INT64
        inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch_size", "sequence_length"]),
                  helper.make_tensor_value_info("attention_mask", i64, ["batch_size", "total_sequence_length"])]
        if not self.fused:
            inputs.append(helper.make_tensor_value_info("position_ids", i64, ["batch_size", "sequence_length"]))
        if self.last_logits:
            inputs.append(helper.make_tensor_value_info("logits_index", i64, ["batch_size"]))
        cache = ["batch_size", s.kv_heads, "past_sequence_length", s.head_size]
        for i in range(s.layers):
            for kv in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", f, cache))
        out_seq = 1 if self.last_logits else "sequence_length"
        outputs = [helper.make_tensor_value_info("logits", f, ["batch_size", out_seq, s.vocab])]
        for _, name in present:
            outputs.append(helper.make_tensor_value_info(name, f, ["batch_size", s.kv_heads, "total_sequence_length",
                                                                   s.head_size]))
        graph = helper.make_graph(g.nodes, s.name.replace(" ", "_")[:64] or "decoder", inputs, outputs, g.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)],
                                  producer_name="mcp-cli", producer_version="gguf")
        model.ir_version = 8
        return model


def build_decoder(gm: GGUFModel, *, dequantized: bool = False, last_logits: bool = False,
                  accuracy_level: int = ACCURACY_FLOAT, fused: bool = True) -> onnx.ModelProto:
    return DecoderBuilder(gm, dequantized=dequantized, last_logits=last_logits, accuracy_level=accuracy_level,
                          fused=fused).build()
