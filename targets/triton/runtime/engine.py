"""Generation on a decoder entry: a KV-cache pool of slots with prefix reuse by blocks,
continuous batching, sampling.

`SlotPool` is made once from a byte budget: per layer one K and one V array [slots, kv_heads,
capacity, head_size], fed to onnxruntime's GroupQueryAttention as past *and* present (its
shared-buffer mode, through I/O binding): a step writes each sequence's new K/V in place, and
nothing is copied from step to step (measured on SmolLM2, 8 streams: 43 ms a step against 70 ms
when each step laid the caches side by side and got them back). A running sequence has a slot;
its slot's full blocks of `block_size` tokens are keyed by a hash of their tokens chained to the
prefix's (vLLM's block pool), so a later prompt that starts the same way finds them: in a free
slot, which it then takes as it is (the slot's blocks stay keyed after its request ends, and
free slots are reused least recently freed first), or in a running one, whose prefix is copied
(a copy of the cache is far cheaper than computing it again).

`Engine` runs one scheduler thread. A request is admitted (FIFO, at most one a slot) when its
prompt and all its `max_tokens` fit a slot (checked at submit: never admitted otherwise); one
step runs every running sequence: the decoding ones together (one token each; a batch of one on
its own slot, more as the slots' whole range), then each prompt's next chunk of at most
`prefill_chunk` tokens on its slot (GroupQueryAttention takes several new tokens after a cache
in a batch of one only), so a long prompt never stalls the streams for its whole length.
Requests beyond `max_queue` waiting are refused at once (`Busy`). A cancelled request's slot is
freed at the next step. Standard library, numpy and onnxruntime (the model's session) only.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np


class RequestError(ValueError):
    """A request that can never run (bad parameters, too long for the context or a slot)."""


class Busy(RuntimeError):
    """The queue is full: try again later."""


def chain(parent: bytes, tokens: list[int]) -> bytes:
    """A full block's key: its tokens and its prefix's key."""
    return hashlib.blake2b(parent + np.asarray(tokens, np.int64).tobytes(), digest_size=16).digest()


class SlotPool:
    """The cache of up to `slots` sequences of at most `capacity` tokens each, and the keys of
    the full blocks each slot holds."""

    def __init__(self, slots: int, capacity: int, block_size: int, layers: int, kv_heads: int, head_size: int,
                 commit: bool = False) -> None:
        """`commit`: the pages written now (the memory held from the load on: a pod too small
        fails its load, not a request mid-stream); else they are taken as the cache fills."""
        if slots < 1 or block_size < 1 or capacity < block_size:
            raise ValueError(f"a pool needs a slot of at least one block: {slots} slots x {capacity} tokens, "
                             f"blocks of {block_size}")
        capacity -= capacity % block_size
        self.slots, self.capacity, self.block_size = slots, capacity, block_size
        self.layers, self.kv_heads, self.head_size = layers, kv_heads, head_size
        self.kv = [np.zeros((slots, kv_heads, capacity, head_size), np.float32) for _ in range(2 * layers)]
        if commit:
            for a in self.kv:
                a.fill(0.0)
        self.keys: list[list[bytes]] = [[] for _ in range(slots)]     # slot -> its full blocks' keys, in order
        self.by_key: dict[bytes, tuple[int, int]] = {}                # key -> (slot, block)
        self.free: OrderedDict[int, None] = OrderedDict((s, None) for s in range(slots))  # front: reused first
        self.reserved = [0] * slots                                   # blocks a running request holds
        self._ort: dict[tuple[int, int], list] = {}

    @staticmethod
    def bytes_per_token(layers: int, kv_heads: int, head_size: int) -> int:
        return 2 * layers * kv_heads * head_size * 4

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.kv)

    @property
    def blocks_total(self) -> int:
        return self.slots * self.capacity // self.block_size

    def used(self) -> int:
        """Blocks held by running requests (what a cached free slot holds is not used)."""
        return sum(self.reserved)

    def cached(self) -> int:
        return sum(len(self.keys[s]) for s in self.free)

    def values(self, start: int, stop: int) -> list:
        """onnxruntime values over slots [start, stop) of each K and V array (no copy), made once."""
        key = (start, stop)
        if key not in self._ort:
            import onnxruntime as ort

            self._ort[key] = [ort.OrtValue.ortvalue_from_numpy(a[start:stop]) for a in self.kv]
        return self._ort[key]

    # -- keys ---------------------------------------------------------------------------------
    def lookup(self, tokens: list[int]) -> tuple[int | None, int, list[bytes]]:
        """(the slot holding the longest run of `tokens`' full blocks, how many blocks, their keys)."""
        parent, keys, found = b"", [], (None, 0)
        bs = self.block_size
        for i in range(len(tokens) // bs):
            parent = chain(parent, tokens[i * bs:(i + 1) * bs])
            hit = self.by_key.get(parent)
            if hit is None:
                break
            keys.append(parent)
            found = (hit[0], i + 1)
        return found[0], found[1], keys

    def forget(self, slot: int, from_block: int = 0) -> None:
        """The slot's keys from `from_block` on (its content there is about to change)."""
        for k in self.keys[slot][from_block:]:
            if self.by_key.get(k, (None,))[0] == slot:
                del self.by_key[k]
        del self.keys[slot][from_block:]

    def register(self, slot: int, key: bytes) -> None:
        self.keys[slot].append(key)
        self.by_key.setdefault(key, (slot, len(self.keys[slot]) - 1))

    # -- slots --------------------------------------------------------------------------------
    def take(self, tokens: list[int], blocks: int, reuse: bool) -> tuple[int, int] | None:
        """A slot for a request of `blocks` blocks whose prompt is `tokens`: (slot, tokens its
        cache already holds); None when no slot is free."""
        if not self.free:
            return None
        hit_slot, n, keys = self.lookup(tokens[:-1]) if reuse else (None, 0, [])   # the last token is always run
        bs = self.block_size
        if hit_slot is not None and hit_slot in self.free:
            slot = hit_slot                                     # its blocks as they are
        else:
            slot = next(iter(self.free))                        # least recently freed
            if hit_slot is not None:                            # a running sequence has the prefix: copy it
                self.forget(slot)
                for a in self.kv:
                    a[slot, :, :n * bs] = a[hit_slot, :, :n * bs]
                for k in keys:
                    self.register(slot, k)
        del self.free[slot]
        self.forget(slot, n)                                    # (n is 0 without a hit)
        self.reserved[slot] = blocks
        return slot, n * bs

    def give_back(self, slot: int) -> None:
        self.reserved[slot] = 0
        self.free[slot] = None                                  # the back: its blocks stay findable longest


@dataclass
class Sampling:
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    prefix_cache: bool = True

    LIMITS = {"max_tokens": (1, 1 << 31), "top_k": (0, 1 << 31)}

    def check(self) -> Sampling:
        for k, (lo, hi) in self.LIMITS.items():
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v < hi:
                raise RequestError(f"{k} must be an integer from {lo}, got {v!r}")
        t, p = self.temperature, self.top_p
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t <= 100:
            raise RequestError(f"temperature must be a number from 0 to 100, got {t!r}")
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 < p <= 1:
            raise RequestError(f"top_p must be a number in (0, 1], got {p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed < 1 << 63):
            raise RequestError(f"seed must be a non-negative integer, got {self.seed!r}")
        return self


def sample(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    """Greedy at temperature 0 (argmax, as in-process greedy), else top-k, top-p over softmax(logits / T)."""
    if s.temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / s.temperature
    order = np.argsort(-z, kind="stable")
    if s.top_k:
        order = order[:s.top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    if s.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), s.top_p) + 1)
        p = p[:keep] / p[:keep].sum()
        order = order[:keep]
    return int(order[rng.choice(len(p), p=p)])


class Request:
    """A generation: its prompt ids, sampling, and `emit(event)`, called from the engine's thread
    with {"token": id} per token, then {"finish": reason} ("stop", "length", "cancelled",
    "error") with the usage counts; `stopped(token) -> bool` may end it early (stop strings);
    `gone() -> bool`, asked before each step, cancels it when the client has left."""

    def __init__(self, prompt: list[int], sampling: Sampling, emit, stopped=None, gone=None) -> None:  # noqa: ANN001
        self.prompt, self.sampling, self.emit, self.stopped = prompt, sampling, emit, stopped
        self.gone = gone            # () -> bool: the client went away (asked before each step)
        self.cancelled = False
        self.arrived = time.monotonic()
        self.arrived_ns = time.time_ns()       # arrival, admission, first token (the spans of a trace)
        self.admitted_ns = self.first_ns = None
        self.slot: int | None = None
        self.tokens: list[int] = []          # tokens whose K/V the slot holds
        self.pending: list[int] = []         # tokens still to run (the prompt's rest, or the last token)
        self.keyed = 0                       # full blocks of it keyed in the pool
        self.parent = b""
        self.generated = 0
        self.cached_tokens = 0
        self.first_token_s: float | None = None
        self.rng: np.random.Generator | None = None   # seeded once the sampling is checked

    def cancel(self) -> None:
        self.cancelled = True

    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt), "completion_tokens": self.generated,
                "cached_tokens": self.cached_tokens}


@dataclass
class Stats:
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0
    generated_tokens: int = 0
    requests: int = 0
    refused: int = 0
    peak_blocks: int = 0
    # seconds, drained by the metrics reader (the latest kept when none reads them)
    ttft: deque = field(default_factory=lambda: deque(maxlen=10_000))
    tbt: deque = field(default_factory=lambda: deque(maxlen=10_000))


def _asks(gone) -> bool:  # noqa: ANN001
    try:
        return bool(gone())
    except Exception:  # noqa: BLE001 - a sender that cannot say is a client gone
        return True


def slot_tokens(budget: int, slots: int, block_size: int, per_token: int, context: int) -> int:
    """The tokens a slot holds: the budget shared by the slots, at most the context, whole
    blocks; 0 when the budget holds no block a slot."""
    tokens = min(context, budget // max(1, slots * per_token))
    return tokens - tokens % block_size


class SlotRunner:
    """Steps of the decoder on the pool's slots: the model's onnxruntime session with each layer's
    K and V bound as past and present alike (GroupQueryAttention's shared buffer), so a step
    writes the new K/V in place. The mask of a row is ones for its cached and new tokens; its
    width is the slot's capacity (GroupQueryAttention reads each row's own length from it)."""

    def __init__(self, session, pool: SlotPool) -> None:  # noqa: ANN001 - onnxruntime.InferenceSession
        self.session, self.pool = session, pool
        names = {i.name for i in session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - names
        if missing:
            raise ValueError(f"not a decoder the engine runs: no {', '.join(sorted(missing))} input")
        # mcp-cli's graphs take logits_index (the LM head for one position a row); others give
        # every position's logits; position_ids, where a graph takes them, count from the cache
        self.has_index, self.has_positions = "logits_index" in names, "position_ids" in names
        self.layers = pool.layers
        self._io: dict[tuple[int, int], object] = {}

    def _binding(self, start: int, stop: int):  # noqa: ANN202
        key = (start, stop)
        io = self._io.get(key)
        if io is None:
            io = self.session.io_binding()
            vals = self.pool.values(start, stop)
            for i in range(self.layers):
                for j, kv in enumerate(("key", "value")):
                    io.bind_ortvalue_input(f"past_key_values.{i}.{kv}", vals[2 * i + j])
                    io.bind_ortvalue_output(f"present.{i}.{kv}", vals[2 * i + j])
            self._io[key] = io
        return io

    def run(self, start: int, stop: int, ids: np.ndarray, lengths: list[int], last: list[int]) -> np.ndarray:
        """Rows = slots [start, stop): `ids` [rows, n] after each row's `lengths` cached tokens;
        logits [rows, vocab] of each row's token `last`."""
        rows, n = ids.shape
        mask = np.zeros((rows, self.pool.capacity), np.int64)
        for r, length in enumerate(lengths):
            mask[r, :length + n] = 1
        io = self._binding(start, stop)
        io.bind_cpu_input("input_ids", np.ascontiguousarray(ids, np.int64))
        io.bind_cpu_input("attention_mask", mask)
        if self.has_index:
            io.bind_cpu_input("logits_index", np.asarray(last, np.int64))
        if self.has_positions:
            io.bind_cpu_input("position_ids", np.asarray(lengths, np.int64)[:, None] + np.arange(n, dtype=np.int64))
        io.bind_output("logits")
        self.session.run_with_iobinding(io)
        logits = io.get_outputs()[-1].numpy()
        return logits[:, 0] if self.has_index else logits[np.arange(rows), np.asarray(last)]


class Engine:
    def __init__(self, session, pool: SlotPool, *, context: int, eos_ids: list[int], vocab: int | None = None,  # noqa: ANN001
                 max_queue: int = 64, prefill_chunk: int = 256, queue_timeout_s: float | None = None,
                 prefix_caching: bool = True) -> None:
        self.runner = SlotRunner(session, pool)
        self.pool, self.context, self.vocab = pool, context, vocab
        self.eos = set(eos_ids)
        self.max_queue, self.prefill_chunk = max_queue, prefill_chunk
        self.queue_timeout_s, self.prefix_caching = queue_timeout_s, prefix_caching
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = Stats()
        self._cv = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="mcp-llm-engine", daemon=True)
        self._thread.start()

    # -- the callers' side ----------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.pool.block_size)

    def check(self, prompt: list[int], s: Sampling) -> None:
        """RequestError for a request that can never run, before any compute."""
        if not prompt:
            raise RequestError("the prompt is empty")
        if self.vocab is not None and any(not 0 <= t < self.vocab for t in prompt):
            raise RequestError(f"prompt token ids must be in [0, {self.vocab})")
        s.check()
        need = len(prompt) + s.max_tokens
        if need > self.context:
            raise RequestError(f"prompt ({len(prompt)} tokens) + max_tokens ({s.max_tokens}) = {need} exceeds the "
                               f"model's context of {self.context} tokens")
        if need > self.pool.capacity:
            raise RequestError(f"prompt ({len(prompt)} tokens) + max_tokens ({s.max_tokens}) = {need} tokens: a "
                               f"KV-cache slot holds {self.pool.capacity} ({self.pool.slots} slots in the pool; "
                               "more kv_cache_bytes or fewer max_concurrent_requests make them longer)")

    def submit(self, req: Request) -> None:
        self.check(req.prompt, req.sampling)
        req.rng = np.random.default_rng(req.sampling.seed)
        with self._cv:
            if len(self.waiting) >= self.max_queue:
                self.stats.refused += 1
                raise Busy(f"the server is busy: {len(self.running)} requests running, {len(self.waiting)} waiting "
                           f"(max_queue {self.max_queue}); try again later")
            self.waiting.append(req)
            self.stats.requests += 1
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=10)

    def snapshot(self) -> dict:
        with self._cv:
            return {"blocks_total": self.pool.blocks_total, "blocks_used": self.pool.used(),
                    "blocks_cached": self.pool.cached(), "block_size": self.pool.block_size,
                    "slots": self.pool.slots, "slot_tokens": self.pool.capacity, "pool_bytes": self.pool.nbytes,
                    "running": len(self.running), "waiting": len(self.waiting)}

    # -- the scheduler thread -------------------------------------------------------------------
    def _finish(self, r: Request, reason: str, error: str | None = None) -> None:
        if r.slot is not None:
            self.pool.give_back(r.slot)
            r.slot = None
        if reason != "cancelled":
            event = {"finish": reason, "usage": r.usage(),
                     "times_ns": (r.arrived_ns, r.admitted_ns, r.first_ns, time.time_ns())}
            if error:
                event["error"] = error
            self._emit(r, event)

    def _emit(self, r: Request, event: dict) -> None:
        try:
            r.emit(event)
        except Exception:  # noqa: BLE001 - a client gone mid-send: its request ends, the others go on
            r.cancelled = True

    def _admit(self) -> None:
        now = time.monotonic()
        while self.waiting:
            r = self.waiting[0]
            if r.cancelled:
                self.waiting.popleft()
                continue
            if self.queue_timeout_s is not None and now - r.arrived > self.queue_timeout_s:
                self.waiting.popleft()
                self._finish(r, "error", f"waited over {self.queue_timeout_s * 1000:.0f} ms in the queue "
                                         "(inference_timeout_ms)")
                continue
            reuse = self.prefix_caching and r.sampling.prefix_cache
            got = self.pool.take(r.prompt, self.blocks_for(len(r.prompt) + r.sampling.max_tokens), reuse)
            if got is None:
                return   # every slot runs: FIFO, it waits and those behind it too
            self.waiting.popleft()
            r.admitted_ns = time.time_ns()
            r.slot, cached = got
            r.tokens, r.pending = list(r.prompt[:cached]), list(r.prompt[cached:])
            r.keyed = cached // self.pool.block_size
            r.parent = self.pool.keys[r.slot][r.keyed - 1] if r.keyed else b""
            r.cached_tokens = cached
            self.stats.prompt_tokens += len(r.prompt)
            self.stats.prefix_hit_tokens += cached
            self.running.append(r)
        self.stats.peak_blocks = max(self.stats.peak_blocks, self.pool.used())

    def _key_full_blocks(self, r: Request) -> None:
        bs = self.pool.block_size
        while (r.keyed + 1) * bs <= len(r.tokens):
            i = r.keyed
            r.parent = chain(r.parent, r.tokens[i * bs:(i + 1) * bs])
            self.pool.register(r.slot, r.parent)
            r.keyed += 1

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self.running and not self.waiting:
                    self._cv.wait()
                if self._stop:
                    for r in [*self.running, *self.waiting]:
                        self._finish(r, "error", "the server is shutting down")
                    self.running, self.waiting = [], deque()
                    return
                for r in [*self.running, *self.waiting]:
                    if not r.cancelled and r.gone is not None and _asks(r.gone):
                        r.cancelled = True   # a prompt's chunks stop too, not only its tokens
                for r in [r for r in self.running if r.cancelled]:
                    self.running.remove(r)
                    self._finish(r, "cancelled")
                self._admit()
                batch = list(self.running)
            if not batch:
                time.sleep(0.001)
                continue
            try:
                self._step(batch)
            except Exception as e:  # noqa: BLE001 - the step failed: its requests get the error, the server goes on
                with self._cv:
                    for r in batch:
                        if r in self.running:
                            self.running.remove(r)
                        self._finish(r, "error", f"{type(e).__name__}: {e}")

    def _forward(self, batch: list[Request]) -> dict[int, np.ndarray]:
        """One step: each decoding request's one token (together), then each prompt's next chunk
        (alone on its slot); the logits of those whose last token ran."""
        out: dict[int, np.ndarray] = {}
        decoding = [r for r in batch if len(r.pending) == 1 and r.tokens]
        prompts = [r for r in batch if r not in decoding]
        if len(decoding) == 1:
            r = decoding[0]
            out[id(r)] = self.runner.run(r.slot, r.slot + 1, np.array([r.pending]), [len(r.tokens)], [0])[0]
        elif decoding:
            lo, hi = min(r.slot for r in decoding), max(r.slot for r in decoding) + 1
            ids = np.zeros((hi - lo, 1), np.int64)
            # a slot in the range that does not decode now writes one throw-away token where
            # nothing is kept: a prompt's slot where its chunk goes next (run after this), a
            # free slot right after its keyed blocks (its last block's key dropped if full)
            bs, cap = self.pool.block_size, self.pool.capacity
            chunks = {r.slot: len(r.tokens) for r in prompts}
            lengths = []
            for slot in range(lo, hi):
                at = chunks.get(slot, len(self.pool.keys[slot]) * bs)
                if at >= cap:
                    at = cap - 1
                    self.pool.forget(slot, cap // bs - 1)
                lengths.append(at)
            for r in decoding:
                ids[r.slot - lo, 0] = r.pending[0]
                lengths[r.slot - lo] = len(r.tokens)
            logits = self.runner.run(lo, hi, ids, lengths, [0] * (hi - lo))
            for r in decoding:
                out[id(r)] = logits[r.slot - lo]
        for r in prompts:
            chunk = r.pending[:self.prefill_chunk]
            n = len(chunk)
            logits = self.runner.run(r.slot, r.slot + 1, np.array([chunk]), [len(r.tokens)], [n - 1])
            r.tokens += chunk
            r.pending = r.pending[n:]
            if not r.pending:
                out[id(r)] = logits[0]
        for r in decoding:
            r.tokens += r.pending
            r.pending = []
        return out

    def _step(self, batch: list[Request]) -> None:
        logits = self._forward(batch)
        now = time.monotonic()
        with self._cv:
            for r in batch:
                if self.prefix_caching and r.sampling.prefix_cache:
                    self._key_full_blocks(r)
                row = logits.get(id(r))
                if row is None or r.cancelled:
                    continue   # a prompt with chunks to go; a cancelled one is freed at the next step
                token = sample(row, r.sampling, r.rng)
                r.generated += 1
                self.stats.generated_tokens += 1
                if r.first_token_s is None:
                    r.first_token_s, r.first_ns = now, time.time_ns()
                    self.stats.ttft.append(now - r.arrived)
                else:
                    self.stats.tbt.append(now - r.last_token_s)
                r.last_token_s = now
                # an end-of-sequence or stop id ends it unsent; a stop string ends it after its token
                stop = token in self.eos and not r.sampling.ignore_eos or token in r.sampling.stop_ids
                if not stop:
                    self._emit(r, {"token": token})
                    if r.stopped is not None and r.stopped(token):
                        stop = True
                if stop or r.generated >= r.sampling.max_tokens:
                    self.running.remove(r)
                    self._finish(r, "stop" if stop else "length")
                else:
                    r.pending = [token]
