"""The local OTLP relay serve puts between Triton and a collector: answers at once, forwards in
order, drops and counts what a dead, failing or slow collector does not take."""

from __future__ import annotations

import socket
import time
import urllib.request

from _helpers import PostSink

from mcp_compiler.targets.triton.trace_relay import TraceRelay


class _Collector(PostSink):
    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.bodies: list[tuple[bytes, str]] = []
        super().__init__(lambda body, ctype: self.bodies.append((body, ctype)), status, delay)
        self.url += "/v1/traces"


def _post(url: str, body: bytes) -> tuple[int, float]:
    t = time.perf_counter()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, time.perf_counter() - t


def _wait(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not cond():
        time.sleep(0.02)
    return cond()


def test_forwards_each_batch_in_order_with_its_content_type():
    col = _Collector()
    relay = TraceRelay(col.url).start()
    try:
        for i in range(5):
            assert _post(relay.url, b"batch%d" % i)[0] == 200
        assert _wait(lambda: relay.stats.forwarded == 5)
    finally:
        relay.close()
        col.close()
    assert [b for b, _ in col.bodies] == [b"batch%d" % i for i in range(5)]
    assert {t for _, t in col.bodies} == {"application/x-protobuf"}
    assert relay.stats.dropped == 0 and "0 dropped" in relay.summary()


def test_a_dead_collector_costs_no_time_and_is_counted():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    relay = TraceRelay(f"http://127.0.0.1:{dead}/v1/traces").start()
    try:
        took = [_post(relay.url, b"x")[1] for _ in range(20)]
        assert max(took) < 0.5, took
        assert _wait(lambda: relay.stats.dropped == 20)
        text = urllib.request.urlopen(relay.metrics_url, timeout=5).read().decode()
    finally:
        relay.close()
    assert "mcp_trace_relay_batches_dropped 20" in text and "mcp_trace_relay_batches_received 20" in text
    assert "unreachable" in relay.summary()


def test_a_failing_and_a_slow_collector_drop_what_they_do_not_take():
    failing = _Collector(status=500)
    relay = TraceRelay(failing.url).start()
    try:
        _post(relay.url, b"x")
        assert _wait(lambda: relay.stats.dropped == 1)
        assert "answered 500" in relay.stats.last_error
    finally:
        relay.close()
        failing.close()
    slow = _Collector(delay=1.0)
    relay = TraceRelay(slow.url, queue_size=2, timeout=0.2).start()
    try:
        took = [_post(relay.url, b"y")[1] for _ in range(10)]   # the queue holds 2: the rest are dropped
        assert max(took) < 0.5, took
        assert _wait(lambda: relay.stats.dropped == 10)
    finally:
        relay.close(drain=0.5)
        slow.close()
    assert relay.stats.forwarded == 0 and relay.stats.received == 10


def test_the_exit_line_counts_one_batch_as_one():
    relay = TraceRelay("http://127.0.0.1:9/v1/traces")   # never started: only the line is read
    relay.stats.received = relay.stats.forwarded = 1
    assert relay.summary().startswith("trace relay: 1 batch received, 1 forwarded to ")
    relay.stats.received = 2
    assert relay.summary().startswith("trace relay: 2 batches received, ")
