"""Generation on a decoder entry: a KV-cache block pool with prefix reuse, continuous batching, sampling.

`BlockPool` is made once from a byte budget: per layer one K and one V array
[kv_heads, blocks * block_size, head_size], so a block is a run of token slots. Full blocks are
keyed by a hash of their tokens chained to their prefix's (vLLM's block pool); a block in use
has a reference count; a freed block goes to the back of an LRU free queue still keyed, so a
later prompt that starts the same way takes it back until it is evicted for a new one.

`Engine` runs one scheduler thread. A request is admitted (FIFO, at most `max_running` at once)
only when blocks for its prompt and all its `max_tokens` can be held (a started request is
never paused or evicted); one step runs every running sequence: decoding ones one token each,
a prompt at most `prefill_chunk` tokens (a long prompt does not stall the streams beside it).
Requests beyond `max_queue` waiting are refused at once (`Busy`). A cancelled request's blocks
are freed at the next step. Standard library and numpy only (the tokenizer is the caller's).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from .decoder import Sequence


class RequestError(ValueError):
    """A request that can never run (bad parameters, too long for the context or the pool)."""


class Busy(RuntimeError):
    """The queue is full: try again later."""


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, layers: int, kv_heads: int, head_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs at least one block of at least one token, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        slots = num_blocks * block_size
        self.kv = [np.zeros((kv_heads, slots, head_size), np.float32) for _ in range(2 * layers)]
        self.ref = [0] * num_blocks
        self.key: list[bytes | None] = [None] * num_blocks
        self.by_key: dict[bytes, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # front: evicted first

    @staticmethod
    def bytes_for(num_blocks: int, block_size: int, layers: int, kv_heads: int, head_size: int) -> int:
        return 2 * layers * kv_heads * num_blocks * block_size * head_size * 4

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.kv)

    def used(self) -> int:
        """Blocks held by running requests (cached free blocks are not used)."""
        return self.num_blocks - len(self.free)

    def cached(self) -> int:
        return sum(1 for b in self.free if self.key[b] is not None)

    @staticmethod
    def chain(parent: bytes, tokens: list[int]) -> bytes:
        return hashlib.blake2b(parent + np.asarray(tokens, np.int64).tobytes(), digest_size=16).digest()

    def lookup(self, tokens: list[int]) -> list[int]:
        """The cached blocks that hold the longest run of `tokens`' full blocks from the start."""
        out, parent = [], b""
        bs = self.block_size
        for i in range(len(tokens) // bs):
            parent = self.chain(parent, tokens[i * bs:(i + 1) * bs])
            b = self.by_key.get(parent)
            if b is None:
                break
            out.append(b)
        return out

    def acquire(self, hits: list[int], fresh: int) -> list[int] | None:
        """A reference on each of `hits` and `fresh` new blocks (evicting the oldest cached), or
        None (nothing taken) when the free blocks do not suffice."""
        free_hits = sum(1 for b in hits if self.ref[b] == 0)
        if len(self.free) - free_hits < fresh:
            return None
        for b in hits:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1
        new = []
        for _ in range(fresh):
            b, _ = self.free.popitem(last=False)
            if self.key[b] is not None:
                if self.by_key.get(self.key[b]) == b:
                    del self.by_key[self.key[b]]
                self.key[b] = None
            self.ref[b] = 1
            new.append(b)
        return hits + new

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None
                if self.key[b] is None:   # nothing to reuse: taken before the cached ones
                    self.free.move_to_end(b, last=False)

    def register(self, block: int, key: bytes) -> None:
        if key not in self.by_key:
            self.by_key[key] = block
            self.key[block] = key

    def slots(self, blocks: list[int], start: int, stop: int) -> np.ndarray:
        pos = np.arange(start, stop)
        return np.asarray(blocks, np.int64)[pos // self.block_size] * self.block_size + pos % self.block_size


class PooledSequence(Sequence):
    """A sequence whose cache lives in the pool's blocks. A step alone hands back the whole cache
    (`full`): kept as it is for the next step alone (no gather), its new tokens written to the
    blocks; in a batch the past is gathered from the blocks."""

    def __init__(self, pool: BlockPool, blocks: list[int], tokens: list[int], cached: int) -> None:
        self.pool, self.blocks = pool, blocks
        self.tokens = list(tokens[:cached])
        self.pending = list(tokens[cached:])
        self.length = cached
        self._work: list[np.ndarray] | None = None

    def past(self) -> list[np.ndarray]:
        if self._work is not None:
            return self._work
        idx = self.pool.slots(self.blocks, 0, self.length)
        return [a[:, idx] for a in self.pool.kv]

    def store(self, new: list[np.ndarray], full: list[np.ndarray] | None = None) -> None:
        n = new[0].shape[1]
        idx = self.pool.slots(self.blocks, self.length, self.length + n)
        for a, x in zip(self.pool.kv, new):
            a[:, idx] = x
        self._work = full
        self.length += n
        self.tokens += self.pending
        self.pending = []


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
        self.seq: PooledSequence | None = None
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


class Engine:
    def __init__(self, decoder, pool: BlockPool, *, context: int, eos_ids: list[int], max_running: int = 8,  # noqa: ANN001
                 max_queue: int = 64, prefill_chunk: int = 256, queue_timeout_s: float | None = None,
                 prefix_caching: bool = True) -> None:
        self.decoder, self.pool, self.context = decoder, pool, context
        self.eos = set(eos_ids)
        self.max_running, self.max_queue, self.prefill_chunk = max_running, max_queue, prefill_chunk
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
        vocab = getattr(self.decoder, "vocab", None)
        if vocab is not None and any(not 0 <= t < vocab for t in prompt):
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        s.check()
        need = len(prompt) + s.max_tokens
        if need > self.context:
            raise RequestError(f"prompt ({len(prompt)} tokens) + max_tokens ({s.max_tokens}) = {need} exceeds the "
                               f"model's context of {self.context} tokens")
        if self.blocks_for(need) > self.pool.num_blocks:
            raise RequestError(f"prompt + max_tokens = {need} tokens needs {self.blocks_for(need)} KV-cache blocks; "
                               f"the pool has {self.pool.num_blocks} ({self.pool.num_blocks * self.pool.block_size} "
                               "tokens)")

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
            return {"blocks_total": self.pool.num_blocks, "blocks_used": self.pool.used(),
                    "blocks_cached": self.pool.cached(), "block_size": self.pool.block_size,
                    "pool_bytes": self.pool.nbytes, "running": len(self.running), "waiting": len(self.waiting)}

    # -- the scheduler thread -------------------------------------------------------------------
    def _finish(self, r: Request, reason: str, error: str | None = None) -> None:
        if r.seq is not None:
            self.pool.release(r.seq.blocks)
            r.seq = None
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
            if len(self.running) >= self.max_running:
                return
            use_cache = self.prefix_caching and r.sampling.prefix_cache
            hits = self.pool.lookup(r.prompt[:-1]) if use_cache else []   # the last token is always run
            total = self.blocks_for(len(r.prompt) + r.sampling.max_tokens)
            blocks = self.pool.acquire(hits, total - len(hits))
            if blocks is None:
                return   # FIFO: it waits for blocks, and those behind it wait too
            self.waiting.popleft()
            r.admitted_ns = time.time_ns()
            cached = len(hits) * self.pool.block_size
            r.seq = PooledSequence(self.pool, blocks, r.prompt, cached)
            r.cached_tokens = cached
            r.keyed = len(hits)                 # full blocks already keyed in the pool
            r.parent = self.pool.key[hits[-1]] if hits else b""
            self.stats.prompt_tokens += len(r.prompt)
            self.stats.prefix_hit_tokens += cached
            self.running.append(r)
        self.stats.peak_blocks = max(self.stats.peak_blocks, self.pool.used())

    def _key_full_blocks(self, r: Request) -> None:
        bs, seq = self.pool.block_size, r.seq
        while (r.keyed + 1) * bs <= seq.length:
            i = r.keyed
            r.parent = self.pool.chain(r.parent, seq.tokens[i * bs:(i + 1) * bs])
            self.pool.register(seq.blocks[i], r.parent)
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
                time.sleep(0.001)   # requests wait for blocks held by none running: cannot happen, never spin
                continue
            try:
                self._step(batch)
            except Exception as e:  # noqa: BLE001 - the step failed: its requests get the error, the server goes on
                with self._cv:
                    for r in batch:
                        if r in self.running:
                            self.running.remove(r)
                        self._finish(r, "error", f"{type(e).__name__}: {e}")

    def _step(self, batch: list[Request]) -> None:
        for r in batch:   # a prompt's next chunk; a decoding sequence has its one token pending
            if len(r.seq.pending) > self.prefill_chunk:
                r.rest = r.seq.pending[self.prefill_chunk:]
                r.seq.pending = r.seq.pending[:self.prefill_chunk]
            else:
                r.rest = []
        logits = self.decoder.step([r.seq for r in batch])
        now = time.monotonic()
        with self._cv:
            for r, row in zip(batch, logits):
                if self.prefix_caching and r.sampling.prefix_cache:
                    self._key_full_blocks(r)
                if r.rest:
                    r.seq.pending = r.rest
                    continue
                if r.cancelled:
                    continue   # freed at the next step
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
                if stop or r.generated >= r.sampling.max_tokens or r.seq.length + 1 >= self.context:
                    self.running.remove(r)
                    self._finish(r, "stop" if stop else "length")
                else:
                    r.seq.pending = [token]
