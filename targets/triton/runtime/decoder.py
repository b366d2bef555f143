"""One decoder step over several sequences of different lengths, their KV cache kept outside.

A decoder entry's model has Optimum's interface (input_ids, attention_mask, position_ids,
past_key_values.N.key/value -> logits, present.N.key/value; mcp-cli's own graphs add
logits_index, so a prefill computes the LM head for one position per row). `Decoder.step` runs
one forward pass for a batch of sequences, each bringing its own new tokens (a prompt's prefill,
or one token) and its own past: past caches are laid side by side, padded to the longest, with
the padding masked out; new tokens are right-padded likewise. It returns each sequence's logits
for its last new token, and hands each sequence the K/V of its new tokens to store (`Sequence`
keeps one contiguous array per layer and K/V, and a batch of one keeps the step's present outputs
as they are). Verify and in-process greedy run it; the serving engine (engine.py) keeps the cache
in its own slots instead. Standard library and numpy only: it ships in the entry.
"""

from __future__ import annotations

import json
import re

import numpy as np

_PAST = re.compile(r"^past_key_values\.(\d+)\.key$")


class Sequence:
    """A sequence's tokens and its cache: per layer K and V [kv_heads, length, head_size], each
    contiguous (a batch of one feeds them as they are, and keeps the step's present outputs as its
    cache: no copy of the cache in Python)."""

    def __init__(self, tokens: list[int], layers: int, kv_heads: int, head_size: int) -> None:
        self.tokens: list[int] = []
        self.pending: list[int] = list(tokens)
        self.length = 0                      # tokens whose K/V are cached
        empty = np.zeros((kv_heads, 0, head_size), np.float32)
        self._kv: list[np.ndarray] = [empty] * (2 * layers)

    def past(self) -> list[np.ndarray]:
        """2 * layers arrays [kv_heads, length, head_size]: K and V of layer 0, then layer 1, ..."""
        return self._kv

    def store(self, new: list[np.ndarray], full: list[np.ndarray] | None = None) -> None:
        """new: the K/V [kv_heads, n, head_size] of the tokens just run; `full`, when the step
        computed past and new side by side without padding, the whole cache as it is now."""
        n = new[0].shape[1]
        self._kv = full if full is not None else [np.concatenate([p, x], axis=1) for p, x in zip(self._kv, new)]
        self.length += n
        self.tokens += self.pending
        self.pending = []


PADDED, PACKED = "padded", "packed"


def llm_record(runner) -> dict:  # noqa: ANN001
    """What the model records of itself as an LLM (`mcp.llm` in its metadata: kv_layout,
    context, ...); {} when it records nothing readable."""
    session = getattr(runner, "session", None)
    try:
        meta = session.get_modelmeta().custom_metadata_map if session is not None else {}
        rec = json.loads(meta.get("mcp.llm") or "{}")
    except (AttributeError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


class Decoder:
    """`runner` runs the model: `run(feeds, outputs) -> list of arrays`, with `input_names`,
    and `input_shapes` ({name: shape}) or an onnxruntime `session`.

    Two cache layouts. "padded" (Optimum's graphs: present = past then the new tokens): the
    pasts are padded to the longest, the padding masked out, a row's new tokens at the padded
    length. "packed" (GroupQueryAttention's): each row's new tokens right after its own cached
    ones, the mask ones from 0 for its cached and new tokens (the new-token padding included: it
    is stored nowhere and, causal, seen by no real token)."""

    def __init__(self, runner, layout: str | None = None) -> None:  # noqa: ANN001
        self.runner = runner
        record = llm_record(runner)
        self.layout = layout or (record.get("kv_layout") if record.get("kv_layout") in (PADDED, PACKED) else PADDED)
        context = record.get("context")
        self.context = context if isinstance(context, int) and context > 0 else None   # recorded: GGUF's
        names = list(runner.input_names)
        self.layers = len([n for n in names if _PAST.match(n)])
        if self.layers == 0 or "input_ids" not in names:
            raise ValueError("not a decoder with a KV cache (no input_ids / past_key_values.N.key inputs)")
        shapes = getattr(runner, "input_shapes", None) or {i.name: i.shape for i in runner.session.get_inputs()}
        dims = shapes["past_key_values.0.key"]
        if len(dims) != 4 or not all(isinstance(d, int) for d in (dims[1], dims[3])):
            raise ValueError(f"past_key_values.0.key has shape {dims}: its KV heads and head size must be fixed")
        self.kv_heads, self.head_size = int(dims[1]), int(dims[3])
        session = getattr(runner, "session", None)
        out = {o.name: o.shape for o in session.get_outputs()} if session is not None else {}
        last = (out.get("logits") or [None])[-1]
        self.vocab = last if isinstance(last, int) else None   # token ids a prompt may hold
        self.has_index = "logits_index" in names
        self.has_positions = "position_ids" in names
        self.outputs = ["logits"] + [f"present.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")]
        self.steps = 0

    def sequence(self, tokens: list[int]) -> Sequence:
        return Sequence(tokens, self.layers, self.kv_heads, self.head_size)

    def step(self, seqs: list[Sequence]) -> np.ndarray:
        """One step: each sequence's pending tokens; logits [len(seqs), vocab] of each one's last
        new token; each sequence's cache grows by its new tokens. One forward pass, except in the
        packed layout, where GroupQueryAttention takes several new tokens after a cache only in a
        batch of one: there the decoding rows run together, the fresh prompts together, and each
        prompt that continues a cache (a reused prefix) alone."""
        if not seqs or any(not s.pending for s in seqs):
            raise ValueError("every sequence in a step needs at least one new token")
        if self.layout != PACKED or len(seqs) == 1:
            return self._forward(seqs)
        groups: dict[object, list[int]] = {}
        for r, s in enumerate(seqs):
            key = "decode" if len(s.pending) == 1 else "fresh" if s.length == 0 else r
            groups.setdefault(key, []).append(r)
        if len(groups) == 1:
            return self._forward(seqs)
        rows = np.empty((len(seqs), 0), np.float32)
        for members in groups.values():
            got = self._forward([seqs[r] for r in members])
            if rows.shape[1] == 0:
                rows = np.empty((len(seqs), got.shape[1]), np.float32)
            rows[members] = got
        return rows

    def _forward(self, seqs: list[Sequence]) -> np.ndarray:
        b = len(seqs)
        past_len = max(s.length for s in seqs)
        new_len = max(len(s.pending) for s in seqs)
        ids = np.zeros((b, new_len), np.int64)
        pos = np.zeros((b, new_len), np.int64)
        mask = np.zeros((b, past_len + new_len), np.int64)
        packed = self.layout == PACKED
        for r, s in enumerate(seqs):
            n = len(s.pending)
            ids[r, :n] = s.pending
            pos[r, :n] = np.arange(s.length, s.length + n)
            pos[r, n:] = s.length + n - 1          # padding: a position the row has (never past the context)
            if packed:
                mask[r, :s.length + new_len] = 1
            else:
                mask[r, :s.length] = 1
                mask[r, past_len:past_len + n] = 1
        if b == 1:   # nothing to pad: the cache as it is
            past = [np.ascontiguousarray(a)[None] for a in seqs[0].past()]
        else:
            past = [np.zeros((b, self.kv_heads, past_len, self.head_size), np.float32) for _ in range(2 * self.layers)]
            for r, s in enumerate(seqs):
                if s.length:
                    for k, a in enumerate(s.past()):
                        past[k][r, :, :s.length] = a
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self.has_positions:
            feeds["position_ids"] = pos
        if self.has_index:
            feeds["logits_index"] = np.array([len(s.pending) - 1 for s in seqs], np.int64)
        for i in range(self.layers):
            feeds[f"past_key_values.{i}.key"] = past[2 * i]
            feeds[f"past_key_values.{i}.value"] = past[2 * i + 1]
        got = self.runner.run(feeds, self.outputs)
        logits, present = got[0], got[1:]
        rows = np.empty((b, logits.shape[-1]), np.float32)
        for r, s in enumerate(seqs):
            n = len(s.pending)
            rows[r] = logits[r, 0 if self.has_index else n - 1]
            at = s.length if packed else past_len
            new = [p[r, :, at:at + n] for p in present]
            s.store(new, full=[p[0] for p in present] if b == 1 else None)
        self.steps += 1
        return rows


def greedy(decoder: Decoder, prompt: list[int], max_new: int, stop: set[int] = frozenset(),
           first_logits: list | None = None) -> list[int]:
    """Greedy tokens after `prompt` (prefill, then one token a step); the prompt's last logits
    go to `first_logits` when given."""
    seq = decoder.sequence(prompt)
    out: list[int] = []
    for _ in range(max_new):
        logits = decoder.step([seq])[0]
        if first_logits is not None and not out:
            first_logits.append(logits)
        nxt = int(np.argmax(logits))
        out.append(nxt)
        if nxt in stop:
            break
        seq.pending = [nxt]
    return out
