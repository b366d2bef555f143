"""The generation engine of a decoder entry (mcp_runtime.engine): its slot pool and the keys of
its blocks, prefix reuse, continuous batching against in-process greedy, sampling, cancellation
and refusals."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _tiny import CONTEXT, HIDDEN, KV_HEADS, LAYERS, VOCAB, write_tiny_gguf

from mcp_compiler.targets.triton.runtime.decoder import Decoder, greedy
from mcp_compiler.targets.triton.runtime.engine import Busy, Engine, Request, RequestError, Sampling, SlotPool, chain, sample

HEAD = HIDDEN // 4


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    from mcp_compiler.frontend.gguf import gguf_decoder
    from mcp_compiler.llm.verify import OrtRunner

    path = write_tiny_gguf(tmp_path_factory.mktemp("engine") / "tiny.gguf")
    return Decoder(OrtRunner(gguf_decoder(path, last_logits=True).SerializeToString()))


def _pool(slots=4, tokens=CONTEXT, size=4):
    return SlotPool(slots, tokens, size, LAYERS, KV_HEADS, HEAD)


class _Collect:
    def __init__(self):
        self.tokens, self.final, self.done = [], None, threading.Event()

    def __call__(self, event):
        if "token" in event:
            self.tokens.append(event["token"])
        else:
            self.final = event
            self.done.set()


def _run(engine, prompt, **kw):
    c = _Collect()
    engine.submit(Request(prompt, Sampling(**kw), c))
    return c


def _until(cond):
    for _ in range(600):
        if cond():
            return
        threading.Event().wait(0.05)
    raise AssertionError("the engine never got there")


def _engine(decoder, pool=None, **kw):
    return Engine(decoder.runner.session, pool or _pool(), context=CONTEXT, eos_ids=[], vocab=VOCAB, **kw)


def test_pool_keys_full_blocks_and_reuses_free_slots_lru():
    pool = _pool(slots=3, tokens=8, size=2)
    slot, cached = pool.take([1, 2, 3, 4, 5], blocks=3, reuse=True)
    assert cached == 0 and pool.used() == 3
    k0 = chain(b"", [1, 2])
    pool.register(slot, k0)
    pool.register(slot, chain(k0, [3, 4]))
    assert pool.lookup([1, 2, 3, 4, 5])[:2] == (slot, 2)
    assert pool.lookup([1, 9, 3, 4])[1] == 0                 # a block is keyed by its prefix too
    pool.give_back(slot)
    assert pool.used() == 0 and pool.cached() == 2           # freed, still findable
    again, cached = pool.take([1, 2, 3, 4, 9], blocks=3, reuse=True)
    assert again == slot and cached == 4                     # the free slot taken as it is
    other, cached = pool.take([1, 2, 3, 4, 7], blocks=3, reuse=True)
    assert other != slot and cached == 4                     # a running slot's prefix: copied
    assert pool.take([5], blocks=1, reuse=True) is not None and pool.take([5], blocks=1, reuse=True) is None


def test_served_greedy_equals_in_process_greedy_in_one_batch(decoder):
    prompts = [[1, 5, 7], [1, 9, 11, 13, 15, 17, 19, 21, 23], [3], list(range(3, 40))]
    want = [greedy(decoder, p, 12) for p in prompts]
    engine = _engine(decoder, prefill_chunk=8)            # the long prompt runs in chunks beside the others
    try:
        runs = [_run(engine, p, max_tokens=12) for p in prompts]
        for c in runs:
            assert c.done.wait(60)
        assert [c.tokens for c in runs] == want
        assert all(c.final["finish"] == "length" and c.final["usage"]["completion_tokens"] == 12 for c in runs)
        assert engine.snapshot()["blocks_used"] == 0
    finally:
        engine.close()


def test_prefix_blocks_are_reused_and_give_the_same_tokens(decoder):
    engine = _engine(decoder)
    try:
        prompt = list(range(3, 30))
        first = _run(engine, prompt, max_tokens=6)
        assert first.done.wait(60) and first.final["usage"]["cached_tokens"] == 0
        again = _run(engine, prompt + [40, 41], max_tokens=6)
        assert again.done.wait(60)
        assert again.final["usage"]["cached_tokens"] == 24     # 6 full blocks of 4 of the 27-token prefix
        assert again.tokens == greedy(decoder, prompt + [40, 41], 6)
        off = _run(engine, prompt + [40, 41], max_tokens=6, prefix_cache=False)
        assert off.done.wait(60) and off.final["usage"]["cached_tokens"] == 0 and off.tokens == again.tokens
        assert engine.stats.prefix_hit_tokens == 24
    finally:
        engine.close()


def test_cancel_frees_blocks_and_the_others_go_on(decoder):
    engine = _engine(decoder)
    try:
        gone = _Collect()
        r = Request([1, 2, 3], Sampling(max_tokens=100), gone)
        engine.submit(r)
        stay = _run(engine, [1, 5, 7], max_tokens=20)
        r.cancel()
        assert stay.done.wait(60) and stay.final["finish"] == "length"
        assert gone.final is None                             # a cancelled stream gets nothing more
        _until(lambda: engine.snapshot()["blocks_used"] == 0)
    finally:
        engine.close()


def test_a_client_whose_send_fails_is_dropped_not_the_server(decoder):
    engine = _engine(decoder)
    try:
        def broken(event):
            raise OSError("stream closed")

        engine.submit(Request([1, 2], Sampling(max_tokens=50), broken))
        ok = _run(engine, [1, 5], max_tokens=5)
        assert ok.done.wait(60) and len(ok.tokens) == 5
    finally:
        engine.close()


def test_requests_that_can_never_run_are_refused_before_any_compute(decoder):
    engine = _engine(decoder, pool=_pool(slots=1, tokens=16, size=4), max_queue=1)
    try:
        with pytest.raises(RequestError, match="empty"):
            engine.submit(Request([], Sampling(), _Collect()))
        with pytest.raises(RequestError, match="context"):
            engine.submit(Request([1] * (CONTEXT - 2), Sampling(max_tokens=10), _Collect()))
        with pytest.raises(RequestError, match="slot holds 16"):
            engine.submit(Request([1] * 10, Sampling(max_tokens=10), _Collect()))
        with pytest.raises(RequestError, match="token ids"):
            engine.submit(Request([VOCAB + 5], Sampling(max_tokens=1), _Collect()))
        for bad in ({"max_tokens": 0}, {"max_tokens": 10**12}, {"temperature": -1}, {"top_p": 0}, {"seed": -3},
                    {"temperature": float("nan")}):
            with pytest.raises(RequestError):
                engine.submit(Request([1], Sampling(**bad), _Collect()))
        assert engine.stats.requests == 0
    finally:
        engine.close()


def _wrap(engine, before):
    """Call `before()` ahead of each forward pass of the engine's runner."""
    inner = engine.runner.run

    def run(*a, **kw):
        before()
        return inner(*a, **kw)

    engine.runner.run = run


def test_full_slots_queue_then_a_full_queue_refuses_at_once(decoder):
    gate = threading.Event()
    engine = _engine(decoder, pool=_pool(slots=1, tokens=16, size=4), max_queue=1)
    _wrap(engine, lambda: gate.wait(60))
    try:
        a = _run(engine, [1, 2, 3], max_tokens=13)             # holds the one slot
        _until(lambda: engine.snapshot()["running"] == 1)
        b = _run(engine, [1, 2], max_tokens=2)                 # waits for it
        _until(lambda: engine.snapshot()["waiting"] == 1)
        with pytest.raises(Busy, match="busy"):
            _run(engine, [1], max_tokens=1)
        gate.set()
        assert a.done.wait(60) and b.done.wait(60) and len(b.tokens) == 2
    finally:
        gate.set()
        engine.close()


def test_sampling_is_seeded_and_temperature_zero_is_argmax():
    logits = np.random.default_rng(1).normal(size=VOCAB).astype(np.float32)
    assert sample(logits, Sampling(temperature=0), np.random.default_rng(0)) == int(np.argmax(logits))
    draw = lambda seed: [sample(logits, Sampling(temperature=1.0, top_p=0.9, top_k=40), rng)  # noqa: E731
                         for rng in [np.random.default_rng(seed)] for _ in range(20)]
    assert draw(7) == draw(7) and draw(7) != draw(8)
    top = set(np.argsort(-logits)[:3].tolist())
    assert all(sample(logits, Sampling(temperature=1.0, top_k=3), np.random.default_rng(s)) in top for s in range(30))


def test_stream_text_holds_back_half_characters_and_stop_strings():
    from mcp_compiler.targets.triton.runtime.text import StreamText

    pieces = {1: "Hel", 2: "lo", 3: " wo", 4: "rld", 5: "\xe9"}
    raw = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    st = StreamText(raw, ["o w"])
    assert st.push(1) == ("H", False)          # "el" may start... no: held back len("o w") - 1 chars
    assert st.push(2) == ("el", False)
    delta, stopped = st.push(3)
    assert stopped and delta == "l" and st.text == "Hell"   # the text ends before the stop string
    half = StreamText(lambda ids: "ab" + ("\ufffd" if ids[-1] == 9 else "c"), [])
    assert half.push(9) == ("ab", False)       # an incomplete UTF-8 character is not sent
    assert half.push(8) == ("c", False)
    st = StreamText(raw, ["zz"])
    out = "".join(st.push(i)[0] for i in (1, 2, 3, 4)) + st.flush()
    assert out == "Hello world"


def test_a_client_gone_during_a_long_prefill_stops_it_between_chunks(decoder):
    engine = _engine(decoder, prefill_chunk=4)
    try:
        left = threading.Event()
        c = _Collect()
        steps = []

        def leave():
            steps.append(1)
            left.set()                   # the client leaves after the first chunk

        _wrap(engine, leave)
        engine.submit(Request(list(range(3, 80)), Sampling(max_tokens=5), c, gone=left.is_set))
        _until(lambda: steps and engine.snapshot()["running"] == 0 and engine.snapshot()["blocks_used"] == 0)
        assert c.tokens == [] and c.final is None and len(steps) <= 2   # 20 chunks, 1 or 2 run
    finally:
        engine.close()
