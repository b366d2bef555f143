"""`mcp-cli bench`: a served model under load, on the local Triton or a running one.

A local entry (DIR/NAME) is served by a tritonserver this process starts on 127.0.0.1 (explicit
mode, only that model loaded) and stops; a NAME with a Connection is measured where it already
serves. The requests are inputs the model accepts (mcp_compiler.inputs, probed on the entry's own
model, as verify makes them), a user's .npz, or for a remote model known only by name, tensors
made from the server's config. Either way a dim no op ties to a size (a sequence length, an
image side; -1 in a remote config) is sent at DEFAULT_LENGTH (128), not 1, unless `--dims` says
otherwise; the shapes sent are in the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mcp_compiler.errors import McpError, ServerError, UsageError
from mcp_compiler.inputs import REQUEST_LENGTH

from .client import Connection, aio_client, infer_inputs, server_error
from .entry import Entry
from .lifecycle import load_model, remote_config, smoke_inputs, wire_feeds
from .loadgen import Load, Point, measure
from .runtime import params as P


class BenchFailedError(ServerError):
    """Every request of every load point failed: nothing was measured (the table still shows it)."""
DEFAULT_LENGTH = REQUEST_LENGTH   # a free dim of a request: a realistic sequence length, not the smallest


@dataclass
class Served:
    """A model that answers on `conn`: its config, name, and the request to send."""

    conn: Connection
    name: str
    config: Any                       # ModelConfig
    feeds: dict[str, np.ndarray]
    server: Any = None                # serve.TritonServer when this process started it
    notes: list[str] = field(default_factory=list)


@dataclass
class BenchReport:
    model: str
    url: str
    batch_size: int
    points: list[Point]
    notes: list[str]
    inputs: dict[str, dict] = field(default_factory=dict)   # name -> {"shape", "dtype"} as sent

    def to_dict(self) -> dict:
        return {"model": self.model, "url": self.url, "batch_size": self.batch_size, "inputs": self.inputs,
                "points": [p.to_dict() for p in self.points], "notes": self.notes}


def shapes_of(feeds: dict[str, np.ndarray]) -> dict[str, dict]:
    return {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()}


def is_entry(target: str | os.PathLike) -> bool:
    return (Path(target) / "config.pbtxt").is_file()


@contextlib.contextmanager
def served(target: str | os.PathLike | Entry, conn: Connection | None, *, batch_size: int = 1,
           inputs: str | os.PathLike | None = None, explicit_config: str | None = None,
           dims: dict[str, int] | None = None, length: int | None = DEFAULT_LENGTH) -> Iterator[Served]:
    """The model to measure, loaded and ready. A local entry with no `conn` gets its own
    tritonserver, stopped (and its folder removed) on the way out, Ctrl-C included. `target`: a
    NAME the server has (with `conn`), DIR/NAME, or an Entry already read (not read again)."""
    notes: list[str] = []
    entry = target if isinstance(target, Entry) else None
    target = entry.path if entry is not None else target
    if conn is None:
        if not is_entry(target):
            raise UsageError(f"{target}: not a model repository entry (DIR/NAME with a config.pbtxt); "
                             "to measure a model a server already has, give its NAME and --url")
        entry = entry or Entry.read(target)
        cfg = entry.config
        feeds = {} if P.GENERATION in cfg.parameters else \
            _batched(smoke_inputs(entry, inputs, dims=dims, length=length, notes=notes), cfg, batch_size)
        from .serve import TritonServer

        server = TritonServer(Path(target).resolve().parent, explicit=True)
        try:
            server.start()
            conn = Connection(server.grpc_url)
            s = Served(conn, cfg.name, cfg, feeds, server, notes=notes)
            try:
                load_model(s, explicit_config)
            except McpError:
                still_serving(s, f"loading {cfg.name}")   # a server that died is the reason, not the load
                raise
            yield s
        finally:
            server.close()
        return
    name = str(target)
    if entry is not None or is_entry(target):
        entry = entry or Entry.read(target)
        cfg = entry.config
        feeds = _batched(smoke_inputs(entry, inputs, dims=dims, length=length, notes=notes), cfg, batch_size)
    else:
        cfg = remote_config(conn, name)
        accepts = None if cfg.HasField("sequence_batching") else (lambda f: _accepted(conn, name, f))
        feeds, notes = ({}, []) if P.GENERATION in cfg.parameters else \
            _remote_feeds(cfg, inputs, batch_size, dims or {}, length or DEFAULT_LENGTH, accepts)
    yield Served(conn, cfg.name or name, cfg, feeds, notes=notes)


def _batched(feeds: dict[str, np.ndarray], cfg: Any, batch_size: int) -> dict[str, np.ndarray]:
    if batch_size == 1:
        return feeds
    if cfg.max_batch_size <= 0:
        raise UsageError(f"--batch-size {batch_size}: {cfg.name} does not batch (max_batch_size 0)")
    if batch_size > cfg.max_batch_size:
        raise UsageError(f"--batch-size {batch_size} exceeds the model's max_batch_size {cfg.max_batch_size}")
    return {k: np.concatenate([v] * batch_size, axis=0) for k, v in feeds.items()}


def _remote_feeds(cfg: Any, inputs: str | os.PathLike | None, batch_size: int, dims: dict[str, int],
                  length: int, accepts: Callable[[dict], bool] | None = None) -> tuple[dict, list[str]]:
    """A request from the server's config alone: the request the entry records (mcp_request), its
    free axes at `length` -- or, where `accepts` (one request to the server) says the server
    refuses that, at the first of RETRY_LENGTHS it takes (a length the model's contracts hide:
    silero_vad's window inside an If). With no recorded request: each -1 dim at `length`, but axis 0 of a
    multi-dim input of a config without batching at 1 (that axis is the batch Triton could not
    take over) (`--dims INPUT.AXIS=N` sets one, the axis as the model sees it, batch at 0;
    `--dims '*=N'` every -1 dim), floats from N(0, 1), integers from [0, 3) (valid token ids and
    indices of any table)."""
    from tritonclient.grpc import model_config_pb2 as mc
    from tritonclient.utils import triton_to_np_dtype

    batched = cfg.max_batch_size > 0
    types = {i.name: triton_to_np_dtype(mc.DataType.Name(i.data_type).removeprefix("TYPE_").replace("STRING", "BYTES"))
             for i in cfg.input}
    if inputs is not None:
        return _npz_for(inputs, types), []
    recorded = P.of_config(cfg).request if P.REQUEST in cfg.parameters else {}
    if recorded and not dims and set(recorded) == set(types):
        def at(n: int) -> dict:   # as the model takes them -> as Triton takes them ([N] as [N, 1])
            return _batched(wire_feeds(cfg, _recorded_feeds(recorded, types, n)), cfg, batch_size)

        has_free = any(spec.get("free") for spec in recorded.values())
        n = length
        if has_free and accepts is not None and not accepts(at(length)):
            n = next((m for m in RETRY_LENGTHS if m != length and accepts(at(m))), length)
        feeds = at(n)
        free = f", its free axes at {n}" if has_free else ""
        refused = f" (the server refused {length})" if n != length else ""
        return feeds, [f"inputs from the server's config: the request the entry records (its value domains and "
                       f"sizes{free}{refused}); --dims or --inputs for another"]
    known = {f"{i.name}.{a + batched}" for i in cfg.input for a, d in enumerate(i.dims) if d < 0} | {"*"}
    unknown = sorted(set(dims) - known)
    if unknown:
        raise UsageError(f"--dims {unknown[0]}: a remote model's dims are named INPUT.AXIS (batch at axis 0); "
                         f"its -1 dims: {', '.join(sorted(known - {'*'})) or 'none'} (or '*' for all)")
    rng = np.random.default_rng(0)
    feeds, chosen = {}, []
    for i in cfg.input:
        shape = [1] if batched else []
        for a, d in enumerate(i.dims):
            key = f"{i.name}.{a + batched}"
            guess = 1 if not batched and a == 0 and len(i.dims) >= 2 else length
            size = d if d > 0 else dims.get(key, dims.get("*", guess))
            if d < 0:
                chosen.append(f"{key}={size}")
            shape.append(size)
        dtype = np.dtype(types[i.name])
        feeds[i.name] = (rng.standard_normal(shape, dtype=np.float32).astype(dtype) if dtype.kind == "f"
                         else rng.integers(0, 3, shape).astype(dtype))
    note = ("inputs made from the server's config (random floats, integers in [0, 3)"
            + (f"; -1 dims: {', '.join(chosen)}" if chosen else "") + "): give DIR/NAME, --dims or --inputs "
            "for requests the model is known to accept")
    return _batched(feeds, cfg, batch_size), [note]


# Lengths tried for a recorded request's free axes when the server refuses the first one.
RETRY_LENGTHS = (256, 512, 1024, 64, 32, 2048)


def _accepted(conn: Connection, name: str, feeds: dict) -> bool:
    """Whether the server runs one request of `feeds` on model `name` (a refused shape, or a
    model error at that size, is False; a server that cannot be reached is its own error)."""
    from mcp_compiler.errors import ServerAuthError, ServerUnreachableError

    from .client import call, client

    c = client(conn)
    try:
        call(conn, f"a request to {name}", c.infer, name, infer_inputs(feeds, conn.protocol), headers=conn.headers())
        return True
    except (ServerUnreachableError, ServerAuthError):
        raise
    except ServerError:
        return False


def _recorded_feeds(recorded: dict, types: dict[str, Any], length: int) -> dict[str, np.ndarray]:
    """One request from the config's mcp_request: each input at its shape with its free axes (a
    length, an image side) at `length` as bench sends a local entry, its values drawn as recorded
    (an index range, one of the compared values, or the float draw: inputs.draw)."""
    from mcp_compiler.inputs import draw

    rng = np.random.default_rng(0)
    feeds = {}
    for name, spec in recorded.items():
        shape, how = [int(d) for d in spec["shape"]], spec["values"]
        for a in spec.get("free", []):
            shape[a] = length
        floats = how[0] if how[0] not in ("range", "choice") else "normal"
        feeds[name] = draw(types[name], shape, how, rng, name, floats)
    return feeds


def _npz_for(path: str | os.PathLike, types: dict[str, Any]) -> dict[str, np.ndarray]:
    """The first sample of an .npz (or folder of them), checked against the server's inputs."""
    from mcp_compiler.files import check_regular_input

    path = Path(path)
    files = sorted(path.glob("*.npz")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"--inputs {path}: no .npz files in the folder")
    check_regular_input(files[0], "--inputs")
    try:
        with np.load(files[0], allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 - zip or npy format errors of many kinds
        raise UsageError(f"--inputs {files[0]}: not a readable .npz ({type(e).__name__}: {e})") from None
    if set(arrays) != set(types):
        raise UsageError(f"--inputs {files[0]}: arrays {sorted(arrays)}, the model's inputs are {sorted(types)}")
    for k, a in arrays.items():
        if a.dtype != np.dtype(types[k]):
            raise UsageError(f"--inputs {files[0]}: array {k!r} is {a.dtype}, the input is {np.dtype(types[k])}")
    return arrays


def measure_points(s: Served, loads: list[Load], *, batch_size: int = 1, window_s: float = 2.0,
                   max_windows: int = 10, seconds: float | None = None, progress=None,  # noqa: ANN001
                   slo_ms: float | None = None, window_progress=None,  # noqa: ANN001
                   sequence_length: int | None = None) -> list[Point]:
    """Each load in turn, one client session. A sequence-batched (stateful) model is sent
    sequences of `sequence_length` requests (default 1)."""
    timeout_ms = _timeout_ms(s.config)
    if s.config is not None and s.config.HasField("sequence_batching"):
        sequence_length = sequence_length or 1
    elif sequence_length is not None:
        raise UsageError(f"--sequence-length: {s.name} is not a stateful (sequence-batched) model")
    async def go() -> list[Point]:
        c = aio_client(s.conn)
        try:
            await _check_ready(c, s)
            inputs = infer_inputs(s.feeds)
            points = []
            for k, load in enumerate(loads):
                if progress is not None:
                    progress(k, len(loads), load)
                points.append(await _watched(s, f"measuring {load.label}", measure(
                    c, s.name, inputs, load, batch_size=batch_size, window_s=window_s, max_windows=max_windows,
                    seconds=seconds, headers=s.conn.headers(), slo_ms=slo_ms, timeout_ms=timeout_ms,
                    progress=window_progress, sequence_length=sequence_length)))
            return points
        finally:
            await c.close()

    return asyncio.run(go())


async def _watched(s: Served, doing: str, work: Any) -> Any:
    """`work` (a coroutine), ended as soon as a local server dies (still_serving's error), not
    after its windows of failed requests."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait([task], timeout=0.5)
        if not task.done() and s.server is not None and not s.server.alive():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    still_serving(s, doing)
    return task.result()


def still_serving(s: Served, doing: str) -> None:
    """A local server that died is the command's error (exit 1), not a point of failed requests."""
    if s.server is not None and not s.server.alive():
        raise ServerError(f"tritonserver exited with code {s.server.died} while {doing} (log: {s.server.log_path})")


def _timeout_ms(cfg: Any) -> float | None:
    """The queue policy's timeout (ms) when the config sets one: a p99 past it is saturation."""
    if cfg is None or not cfg.HasField("dynamic_batching"):
        return None
    us = cfg.dynamic_batching.default_queue_policy.default_timeout_microseconds
    return us / 1000 if us else None


async def _check_ready(c, s: Served) -> None:  # noqa: ANN001
    try:
        ready = await c.is_model_ready(s.name, headers=s.conn.headers(), client_timeout=s.conn.timeout)
    except Exception as e:  # noqa: BLE001 - grpc raises many kinds
        raise server_error(s.conn, e, f"checking {s.name}") from None
    if not ready:
        raise ServerError(f"{s.name} is not READY on {s.conn.describe()}")
    if await _stats_missing(c, s):
        raise ServerError(f"{s.conn.describe()} does not answer the statistics extension for {s.name}")


async def _stats_missing(c, s: Served) -> bool:  # noqa: ANN001
    try:
        await c.get_inference_statistics(s.name, headers=s.conn.headers(), as_json=True, client_timeout=10)
    except Exception:  # noqa: BLE001
        return True
    return False


def bench(target: str | os.PathLike, loads: list[Load], conn: Connection | None = None, *, batch_size: int = 1,
          window_s: float = 2.0, max_windows: int = 10, seconds: float | None = None,
          inputs: str | os.PathLike | None = None, progress=None,  # noqa: ANN001
          dims: dict[str, int] | None = None, slo_ms: float | None = None, window_progress=None,  # noqa: ANN001
          on_inputs=None, sequence_length: int | None = None) -> BenchReport:  # noqa: ANN001 - on_inputs(shapes, notes)
    with served(target, conn, batch_size=batch_size, inputs=inputs, dims=dims) as s:
        if on_inputs is not None:
            on_inputs(shapes_of(s.feeds), s.notes)
        points = measure_points(s, loads, batch_size=batch_size, window_s=window_s, max_windows=max_windows,
                                seconds=seconds, progress=progress, slo_ms=slo_ms, window_progress=window_progress,
                                sequence_length=sequence_length)
        notes = list(s.notes)
        if s.server is not None:
            notes.append(f"measured on a local tritonserver at grpc://{s.conn.url} started for this run")
        return BenchReport(s.name, s.conn.describe(), batch_size, points, notes, shapes_of(s.feeds))
