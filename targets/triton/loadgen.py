"""Load on a served model, measured: perf_analyzer's job with tritonclient's asyncio gRPC client.

Closed loop (`concurrency` clients, each sending its next request when the last one returns) or
open loop (Poisson arrivals at `rate` requests per second, however the server keeps up). The
load runs in measurement windows; a point is stable when three windows in a row agree within
10% on throughput and on p99 latency (perf_analyzer's rule), or after `seconds` when a fixed
duration is asked. On a noisy machine the windows grow (twice as long after every three that
disagree, up to 4x) and after `max_windows` the point is reported with the coefficient of
variation of its windows' throughput instead of looping on. An open-loop point that serves
under 95% of the requests it issued, or issues short of the offered rate by more than three
Poisson standard deviations, or whose p99 passes the timeout, is marked saturated; with an SLO
each point reports the fraction of requests within it (SLO attainment). Triton's
statistics API, read around the windows, splits the server's time into queue and compute and
gives the average batch it executed; the client's own CPU time says when the client, not the
server, is the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

STABLE_WINDOWS = 3
STABLE_SPREAD = 0.10
MAX_GROWTH = 4            # windows grow to at most 4x their length on a noisy machine
SATURATED_RATE = 0.95     # open loop: achieved / offered below this is saturation
WARMUP_S = 0.5
MAX_OUTSTANDING = 4096   # open loop: requests in flight beyond this are dropped (counted as errors)
_REJECTED = ("queue size", "timeout expired", "exceeds maximum queue", "request timeout")


@dataclass(frozen=True)
class Load:
    """One load point: `concurrency` clients in closed loop, or `rate` requests/s in open loop."""

    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency else f"rate {self.rate:g}/s"


@dataclass
class Point:
    """What one load point measured."""

    load: str
    concurrency: int | None
    rate: float | None
    batch_size: int
    requests: int
    seconds: float
    throughput: float            # successful requests per second
    infer_per_s: float           # throughput x batch size
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    errors: int                  # failed requests, rejections included
    rejected: int                # refused by the server's queue policy (full queue, timeout)
    error_sample: str | None
    queue_ms: float | None       # server: average time a request waited in the queue
    compute_ms: float | None     # server: average input + infer + output time per request
    avg_batch: float | None      # server: requests per model execution
    client_cpu: float            # the client's CPU time / wall time (1.0 = one core busy)
    windows: int
    stable: bool | None          # None: a fixed --seconds window, not checked
    notes: list[str] = field(default_factory=list)
    cv: float | None = None      # coefficient of variation of the windows' throughput
    saturated: bool = False      # open loop: served < 95% of issued, issued short of the rate, or p99 past the timeout
    slo_attainment: float | None = None   # fraction of requests within the SLO (when one is given)
    slo_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Window:
    latencies: list[float]
    sent: int
    errors: int
    rejected: int
    seconds: float
    cpu: float
    stats: dict[str, float] | None
    sample: str | None

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0

    @property
    def p99(self) -> float:
        return float(np.percentile(self.latencies, 99)) if self.latencies else float("inf")


EARLY_FAILURES = 20   # a point whose first this-many requests all failed is stopped: it will not get better


class _Recorder:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.sent = 0            # open loop: requests issued
        self.errors = 0
        self.rejected = 0
        self.sample: str | None = None
        self.ever_ok = self.ever_failed = 0
        self.first_sample: str | None = None
        self.hopeless = asyncio.Event()   # set when the first EARLY_FAILURES requests all failed
        self.started: dict[int, float] = {}   # requests in flight: id -> when sent

    def ok(self, seconds: float) -> None:
        self.latencies.append(seconds)
        self.ever_ok += 1

    def failed(self, e: BaseException) -> None:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        self.errors += 1
        self.ever_failed += 1
        if any(k in msg.lower() for k in _REJECTED):
            self.rejected += 1
        self.sample = self.sample or msg[:300]
        self.first_sample = self.first_sample or msg[:300]
        if not self.ever_ok and self.ever_failed >= EARLY_FAILURES:
            self.hopeless.set()

    def in_flight(self) -> str:
        """What a point that completed nothing was waiting for."""
        if not self.started:
            return "none in flight"
        oldest = time.perf_counter() - min(self.started.values())
        return f"{len(self.started)} in flight, the slowest sent {oldest:.1f} s ago"


async def _sleep(rec: _Recorder, seconds: float) -> None:
    """`seconds`, or less when the point turned out hopeless."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(rec.hopeless.wait(), seconds)


async def server_stats(client, name: str, headers: dict | None) -> dict[str, float] | None:  # noqa: ANN001
    """Cumulative counters of `name` (all versions) from Triton's statistics extension, or None."""
    try:
        js = await client.get_inference_statistics(name, headers=headers, as_json=True, client_timeout=10)
    except Exception:  # noqa: BLE001 - a server without the extension: the split is left out
        return None
    out = {"success": 0.0, "queue_ns": 0.0, "compute_ns": 0.0, "count": 0.0, "inferences": 0.0, "executions": 0.0}
    for m in js.get("model_stats", []):
        s = m.get("inference_stats", {})
        out["inferences"] += float(m.get("inference_count", 0))
        out["executions"] += float(m.get("execution_count", 0))
        out["success"] += float(s.get("success", {}).get("count", 0))
        out["count"] += float(s.get("queue", {}).get("count", 0))
        out["queue_ns"] += float(s.get("queue", {}).get("ns", 0))
        out["compute_ns"] += sum(float(s.get(k, {}).get("ns", 0))
                                 for k in ("compute_input", "compute_infer", "compute_output"))
    return out


async def measure(client, name: str, inputs: list, load: Load, *, batch_size: int = 1,  # noqa: ANN001
                  window_s: float = 2.0, max_windows: int = 10, seconds: float | None = None,
                  version: str = "", headers: dict | None = None, seed: int = 0,
                  slo_ms: float | None = None, timeout_ms: float | None = None,
                  progress=None, sequence_length: int | None = None) -> Point:  # noqa: ANN001 - progress(window k, throughput, p99 ms)
    """Drive `load` on model `name` and measure it (see the module docstring). A stateful model
    (`sequence_length` given): each closed-loop client streams sequences of that many requests
    under its own correlation IDs (START on the first, END on the last); open loop sends
    one-request sequences."""
    rec = _Recorder()
    stop = asyncio.Event()
    ids = iter(range(1 + seed * 10**9, 2**63))

    async def one(seq: dict | None = None) -> None:
        t0 = time.perf_counter()
        key = id(asyncio.current_task())
        rec.started[key] = t0
        try:
            await client.infer(name, inputs, model_version=version, headers=headers, client_timeout=60, **(seq or {}))
        except Exception as e:  # noqa: BLE001 - counted per request
            rec.failed(e)
            return
        finally:
            rec.started.pop(key, None)
        rec.ok(time.perf_counter() - t0)

    def step(corrid: int, k: int, n: int) -> dict | None:
        if sequence_length is None:
            return None
        return {"sequence_id": corrid, "sequence_start": k == 0, "sequence_end": k == n - 1}

    async def closed() -> None:
        n = sequence_length or 1
        while not stop.is_set():
            corrid = next(ids)
            for k in range(n):   # a sequence begun is finished (its END sent), stop or not
                await one(step(corrid, k, n))

    async def open_loop() -> None:
        rng = np.random.default_rng(seed)
        pending: set[asyncio.Task] = set()
        due = time.perf_counter()
        while not stop.is_set():
            due += float(rng.exponential(1.0 / load.rate))
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(pending) >= MAX_OUTSTANDING:
                rec.failed(RuntimeError("client: too many requests in flight (the server does not keep up)"))
                continue
            rec.sent += 1
            t = asyncio.ensure_future(one(step(next(ids), 0, 1)))
            pending.add(t)
            t.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending, timeout=60)

    workers = [asyncio.ensure_future(closed()) for _ in range(load.concurrency)] if load.concurrency \
        else [asyncio.ensure_future(open_loop())]
    windows: list[_Window] = []
    notes: list[str] = []
    try:
        await _sleep(rec, WARMUP_S)
        length = seconds if seconds is not None else window_s
        limit = 1 if seconds is not None else max_windows
        while len(windows) < limit:
            w = await _window(client, name, headers, rec, length)
            windows.append(w)
            if progress is not None:
                progress(len(windows), w.throughput, w.p99 * 1e3 if w.latencies else None)
            if rec.hopeless.is_set():
                notes.append(f"stopped early: its first {rec.ever_failed} requests all failed "
                             f"({rec.first_sample})")
                break
            if seconds is None and _stable(windows):
                break
            if seconds is None and len(windows) % STABLE_WINDOWS == 0 and length < window_s * MAX_GROWTH:
                length *= 2   # noisy: longer windows average more of it out
        if not rec.ever_ok and not rec.ever_failed:
            notes.append(f"no request completed in {sum(w.seconds for w in windows) + WARMUP_S:.1f} s: "
                         f"{rec.in_flight()} (a request slower than the measurement: longer --seconds)")
    finally:
        stop.set()
        # requests still in flight end (60 s client timeout at most); where none ever completed, the
        # workers are not waited on for long
        _, hung = await asyncio.wait(workers, timeout=90 if rec.ever_ok else 5)
        for t in hung:
            t.cancel()
    point = _point(load, batch_size, windows, seconds, slo_ms=slo_ms, timeout_ms=timeout_ms)
    point.notes[:0] = notes
    return point


async def _window(client, name: str, headers: dict | None, rec: _Recorder, length: float) -> _Window:  # noqa: ANN001
    before = await server_stats(client, name, headers)
    if not rec.hopeless.is_set():   # a point hopeless in its warm-up reports the failures it saw there
        rec.latencies, rec.errors, rec.rejected, rec.sample, rec.sent = [], 0, 0, None, 0
    t0, c0 = time.perf_counter(), time.process_time()
    await _sleep(rec, length)
    lat, errors, rejected, sample, sent = rec.latencies, rec.errors, rec.rejected, rec.sample, rec.sent
    rec.latencies, rec.errors, rec.rejected, rec.sent = [], 0, 0, 0
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = await server_stats(client, name, headers)
    stats = {k: after[k] - before[k] for k in after} if before is not None and after is not None else None
    return _Window(lat, sent, errors, rejected, wall, cpu / wall if wall > 0 else 0.0, stats, sample)


def _stable(windows: list[_Window]) -> bool:
    last = windows[-STABLE_WINDOWS:]
    if len(last) < STABLE_WINDOWS or any(not w.latencies for w in last):
        return False
    for values in ([w.throughput for w in last], [w.p99 for w in last]):
        mean = sum(values) / len(values)
        if mean <= 0 or any(abs(v - mean) > STABLE_SPREAD * mean for v in values):
            return False
    return True


def _point(load: Load, batch_size: int, windows: list[_Window], seconds: float | None, *,
           slo_ms: float | None = None, timeout_ms: float | None = None) -> Point:
    stable = None if seconds is not None else _stable(windows)
    used = windows[-STABLE_WINDOWS:] if stable else windows   # unstable: everything measured
    lat = np.asarray([x for w in used for x in w.latencies]) * 1e3
    wall = sum(w.seconds for w in used)
    n = len(lat)
    stats = [w.stats for w in used]
    queue_ms = compute_ms = avg_batch = None
    notes = []
    if all(s is not None for s in stats) and stats:
        tot = {k: sum(s[k] for s in stats) for k in stats[0]}
        if tot["count"] > 0:
            queue_ms = tot["queue_ns"] / tot["count"] / 1e6
            compute_ms = tot["compute_ns"] / tot["count"] / 1e6
        if tot["executions"] > 0:
            avg_batch = tot["inferences"] / tot["executions"] / max(batch_size, 1)
    else:
        notes.append("the server's statistics extension did not answer: no queue/compute split")
    cpu = sum(w.cpu * w.seconds for w in used) / wall if wall > 0 else 0.0
    if cpu > 0.8:
        notes.append(f"the client used {cpu:.0%} of a core: it may be the bottleneck, not the server")
    rates = [w.throughput for w in windows if w.seconds > 0]
    cv = float(np.std(rates) / np.mean(rates)) if len(rates) > 1 and np.mean(rates) > 0 else None
    if stable is False:
        notes.append(f"not stable after {len(windows)} windows (3 in a row within 10%): figures over all of "
                     f"them, throughput CV {cv:.1%}" if cv is not None else
                     f"not stable after {len(windows)} windows: figures over all of them")
    pct = (lambda q: round(float(np.percentile(lat, q)), 3)) if n else (lambda q: None)
    achieved = n / wall if wall else 0.0
    saturated = False
    sent = sum(w.sent for w in used)
    expected = load.rate * wall if load.rate else 0.0
    # Poisson arrivals: a window's count varies by sqrt(rate x seconds); only what is beyond three
    # of those, or requests issued and not served, says the server (or the client) does not keep up
    if load.rate and (n < SATURATED_RATE * sent or sent < expected - 3 * expected ** 0.5):
        saturated = True
        notes.append(f"saturated: {achieved:.1f} of the {load.rate:g} requests/s offered were served "
                     f"({achieved / load.rate:.0%}; {sent} issued, {n} served)")
    if timeout_ms is not None and n and float(np.percentile(lat, 99)) > timeout_ms:
        saturated = True
        notes.append(f"saturated: p99 {float(np.percentile(lat, 99)):.1f} ms is past the {timeout_ms:g} ms timeout")
    attained = None
    if slo_ms is not None:
        total = n + sum(w.errors for w in used)
        attained = round(float((lat <= slo_ms).sum()) / total, 4) if total else None
    return Point(load.label, load.concurrency, load.rate, batch_size, n, round(wall, 3),
                 round(n / wall, 2) if wall else 0.0, round(n * batch_size / wall, 2) if wall else 0.0,
                 pct(50), pct(90), pct(99), round(float(lat.mean()), 3) if n else None,
                 sum(w.errors for w in used), sum(w.rejected for w in used),
                 next((w.sample for w in used if w.sample), None),
                 None if queue_ms is None else round(queue_ms, 3), None if compute_ms is None else round(compute_ms, 3),
                 None if avg_batch is None else round(avg_batch, 2), round(cpu, 3), len(windows), stable, notes,
                 None if cv is None else round(cv, 4), saturated, attained, slo_ms)
