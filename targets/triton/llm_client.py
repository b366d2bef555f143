"""Talking to a generation entry (a decoupled decoder LLM) over gRPC's bidirectional stream.

`stream(...)` is an async iterator of `Chunk`s: one a token (its ids and text delta), the last
with the finish reason and the usage counts. Closing it early (a client gone, a stop) cancels
the request on the server, which frees its KV-cache blocks within one step. An error the entry
sends (a bad parameter, a full queue) is raised as `GenerationError` with the entry's message.
`mcp-cli generate`, the OpenAI-compatible front, bench and the tests use it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field

import numpy as np

_LOOP: asyncio.AbstractEventLoop | None = None
_LOCK = threading.Lock()


def shared_loop() -> asyncio.AbstractEventLoop:
    """The one event loop this process talks to generation entries from, running in a daemon
    thread. grpc's asyncio client binds its completion queue to the first loop that uses it: a
    later `asyncio.run` loop gets its events late or not at all ("Event loop is closed"), so
    every caller here (generate, bench, deploy's smoke test, the OpenAI front) uses this one."""
    global _LOOP
    with _LOCK:
        if _LOOP is None or _LOOP.is_closed():
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="mcp-grpc-aio", daemon=True).start()
        return _LOOP


def run(coro: Coroutine):  # noqa: ANN201 - what the coroutine returns
    """Run `coro` on the shared loop and wait for it."""
    return asyncio.run_coroutine_threadsafe(coro, shared_loop()).result()


class GenerationError(RuntimeError):
    """The entry refused or failed the request; `busy` when its queue was full."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.busy = "busy" in message and "try again" in message


@dataclass
class Chunk:
    text: str = ""
    ids: list[int] = field(default_factory=list)
    finish: str = ""
    usage: dict | None = None


def request_inputs(*, prompt: str | None = None, messages: list | None = None, ids: list[int] | None = None,
                   sampling: dict | None = None) -> list:
    import tritonclient.grpc.aio as aio

    def text(name: str, value: str):  # noqa: ANN202
        i = aio.InferInput(name, [1], "BYTES")
        i.set_data_from_numpy(np.array([value.encode("utf-8", "surrogatepass")], dtype=object))
        return i

    inputs = []
    if prompt is not None:
        inputs.append(text("text_input", prompt))
    if messages is not None:
        inputs.append(text("messages", json.dumps(messages, ensure_ascii=False)))
    if ids is not None:
        i = aio.InferInput("input_ids", [len(ids)], "INT64")
        i.set_data_from_numpy(np.asarray(ids, np.int64))
        inputs.append(i)
    if sampling:
        inputs.append(text("sampling_parameters", json.dumps(sampling)))
    return inputs


def _value(result, name: str):  # noqa: ANN001, ANN202 - an InferResult
    a = result.as_numpy(name)
    return None if a is None else a.reshape(-1)


async def stream(client, model: str, *, prompt: str | None = None, messages: list | None = None,  # noqa: ANN001
                 ids: list[int] | None = None, sampling: dict | None = None, headers: dict | None = None,
                 request_id: str = "") -> AsyncIterator[Chunk]:
    """The entry's responses as Chunks (the aio client of client.aio_client)."""
    inputs = request_inputs(prompt=prompt, messages=messages, ids=ids, sampling=sampling)

    async def requests():  # noqa: ANN202
        yield {"model_name": model, "inputs": inputs, "request_id": request_id, "enable_empty_final_response": True}

    it = client.stream_infer(requests(), headers=headers)
    done = False
    try:
        async for result, error in it:
            if error is not None:
                done = True
                raise GenerationError(error.message() if hasattr(error, "message") else str(error))
            final = result.get_response().parameters.get("triton_final_response")
            is_final = bool(final is not None and final.bool_param)
            text = _value(result, "text_output")
            chunk = Chunk()
            if text is not None and text.size:
                chunk.text = text[0].decode("utf-8", "replace") if isinstance(text[0], bytes) else str(text[0])
            got = _value(result, "token_ids")
            chunk.ids = [] if got is None else [int(t) for t in got]
            finish = _value(result, "finish_reason")
            chunk.finish = finish[0].decode() if finish is not None and finish.size else ""
            usage = _value(result, "usage")
            if usage is not None and usage.size and usage[0]:
                chunk.usage = json.loads(usage[0])
            if is_final:
                done = True
            if chunk.text or chunk.ids or chunk.finish:
                yield chunk
            if is_final:
                return
    finally:
        if not done:
            it.cancel()   # the consumer left early: the server frees the request


async def complete(client, model: str, **kw) -> Chunk:  # noqa: ANN001
    """The whole generation as one Chunk (text and ids joined, the last finish and usage)."""
    out = Chunk()
    async for c in stream(client, model, **kw):
        out.text += c.text
        out.ids += c.ids
        out.finish = c.finish or out.finish
        out.usage = c.usage or out.usage
    return out
