"""An OpenAI-compatible HTTP front for a Triton server's generation entries (starlette + uvicorn).

`/v1/models`, `/v1/completions` and `/v1/chat/completions` (the entry's chat template), each
streamed as server-sent events (`stream: true`) or whole, with `usage`, vLLM's `ignore_eos`
extension, and errors in OpenAI's shape ({"error": {"message", "type", "param", "code"}}). It
talks to Triton over the gRPC stream (llm_client); a client that disconnects mid-stream cancels
its request there. `mcp-cli serve REPO --openai-port PORT` runs it beside the server.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from .llm_client import GenerationError, complete, stream
from .runtime import params as P

# OpenAI's request fields this front takes; any other is refused by name (silently ignoring
# `n: 3` or `logprobs` would answer something the client did not ask for)
COMMON = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
          "stream", "stream_options", "ignore_eos", "n", "user", "presence_penalty", "frequency_penalty",
          "stop_token_ids"}
COMPLETION = COMMON | {"prompt", "echo", "logprobs", "suffix", "best_of"}
CHAT = COMMON | {"messages", "logprobs", "top_logprobs", "response_format", "tools", "tool_choice"}
MAX_BODY = 8 << 20
CHAT_MAX_TOKENS = 512   # a chat request without max_tokens (OpenAI's: to the context's end)


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


class Front:
    def __init__(self, grpc_url: str, *, ssl: bool = False, root_cert: str | None = None,
                 api_key: str | None = None) -> None:
        self.grpc_url, self.ssl, self.root_cert, self.api_key = grpc_url, ssl, root_cert, api_key
        self._client = None
        self._models: dict[str, dict] = {}

    def client(self):  # noqa: ANN201 - made in the server's event loop
        if self._client is None:
            import tritonclient.grpc.aio as aio

            root = open(self.root_cert, "rb").read() if self.root_cert else None
            self._client = aio.InferenceServerClient(self.grpc_url, ssl=self.ssl, root_certificates=root)
        return self._client

    async def models(self, refresh: bool = False) -> dict[str, dict]:
        if refresh or not self._models:
            c = self.client()
            try:
                index = await c.get_model_repository_index(as_json=True)
            except Exception as e:  # noqa: BLE001 - Triton unreachable
                raise ApiError(503, f"the Triton server at {self.grpc_url} does not answer: {e}", "server_error") from None
            found = {}
            for m in index.get("models", []):
                if m.get("state") != "READY":
                    continue
                try:
                    cfg = (await c.get_model_config(m["name"], as_json=True))["config"]
                except Exception:  # noqa: BLE001 - unloaded meanwhile
                    continue
                if P.GENERATION in cfg.get("parameters", {}):
                    found[m["name"]] = cfg
            self._models = found
        return self._models

    async def model(self, name: object) -> str:
        if not isinstance(name, str) or not name:
            raise ApiError(400, "model is required", param="model")
        if name not in await self.models() and name not in await self.models(refresh=True):
            raise ApiError(404, f"The model `{name[:200]}` does not exist (the server's LLM entries: "
                                f"{', '.join(sorted(self._models)) or 'none'})", "invalid_request_error", "model")
        return name

    def check_key(self, headers) -> None:  # noqa: ANN001
        if self.api_key is None:
            return
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not _same(auth[7:], self.api_key):
            raise ApiError(401, "Incorrect API key provided", "invalid_request_error")


def _same(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())


def sampling(body: dict, allowed: set[str], chat: bool) -> dict:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"Unrecognized request argument supplied: {unknown[0][:60]}", param=unknown[0][:60])
    if body.get("n", 1) != 1 or body.get("best_of", 1) != 1:
        raise ApiError(400, "only n = 1 is supported", param="n")
    for k in ("logprobs", "top_logprobs", "echo", "suffix", "tools", "response_format"):
        if body.get(k) not in (None, False, 0):
            raise ApiError(400, f"{k} is not supported", param=k)
    for k in ("presence_penalty", "frequency_penalty"):
        if body.get(k) not in (None, 0, 0.0):
            raise ApiError(400, f"{k} is not supported (0 only)", param=k)
    out: dict = {}
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    if mt is None:
        mt = CHAT_MAX_TOKENS if chat else 16
    out["max_tokens"] = mt
    out["temperature"] = body.get("temperature", 1.0)
    for k in ("top_p", "top_k", "seed", "ignore_eos", "stop_token_ids"):
        if body.get(k) is not None:
            out[k] = body[k]
    if body.get("stop") is not None:
        out["stop"] = body["stop"]
    return out


def _usage(u: dict | None) -> dict:
    u = u or {}
    p, c = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
    d = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    if u.get("cached_tokens"):
        d["prompt_tokens_details"] = {"cached_tokens": u["cached_tokens"]}
    return d


def build_app(front: Front):  # noqa: ANN201 - a Starlette app
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def body_of(request: Request) -> dict:
        front.check_key(request.headers)
        raw = b""
        async for part in request.stream():
            raw += part
            if len(raw) > MAX_BODY:
                raise ApiError(413, f"the request body is over {MAX_BODY:,} bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            raise ApiError(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    def handled(fn):  # noqa: ANN001, ANN202
        async def endpoint(request: Request):  # noqa: ANN202
            try:
                return await fn(request)
            except ApiError as e:
                return JSONResponse(e.body(), status_code=e.status)
            except GenerationError as e:
                err = ApiError(429 if e.busy else 400, str(e), "rate_limit_error" if e.busy else "invalid_request_error")
                return JSONResponse(err.body(), status_code=err.status)
        return endpoint

    async def list_models(request: Request):  # noqa: ANN202
        front.check_key(request.headers)
        models = await front.models(refresh=True)
        return JSONResponse({"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "mcp-cli"}
                                                        for n in sorted(models)]})

    async def generate(request: Request, chat: bool):  # noqa: ANN202
        body = await body_of(request)
        model = await front.model(body.get("model"))
        params = sampling(body, CHAT if chat else COMPLETION, chat)
        kw: dict = {"sampling": params}
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ApiError(400, "messages must be a non-empty list", param="messages")
            norm = []
            for m in msgs:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):   # [{"type": "text", "text": ...}]
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
                    raise ApiError(400, 'each message needs a "role" and a text "content"', param="messages")
                norm.append({"role": m["role"], "content": content})
            kw["messages"] = norm
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                kw["ids"] = prompt
            elif isinstance(prompt, str):
                kw["prompt"] = prompt
            else:
                raise ApiError(400, "prompt must be a string or a list of token ids (one prompt a request)", param="prompt")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            whole = await complete(front.client(), model, request_id=rid, **kw)
            choice = {"index": 0, "finish_reason": whole.finish or None, "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": whole.text}} if chat else {"text": whole.text})
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
                                 "usage": _usage(whole.usage)})
        gen = stream(front.client(), model, request_id=rid, **kw)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        first = await _first(gen)   # an error before the first token is an HTTP error, not a broken stream

        async def events():  # noqa: ANN202
            chunk_obj = "chat.completion.chunk" if chat else "text_completion"

            def event(delta: str | None, finish: str | None, role: bool = False) -> str:
                if chat:
                    d = {"role": "assistant", "content": ""} if role else ({"content": delta} if delta else {})
                    choice = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
                else:
                    choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
                return "data: " + json.dumps({"id": rid, "object": chunk_obj, "created": created, "model": model,
                                              "choices": [choice]}) + "\n\n"

            usage = None
            try:
                if chat:
                    yield event(None, None, role=True)
                chunks = [first] if first is not None else []
                async for c in _chain(chunks, gen):
                    if c.text or c.finish:
                        yield event(c.text, c.finish or None)
                    usage = c.usage or usage
                if include_usage:
                    yield "data: " + json.dumps({"id": rid, "object": chunk_obj, "created": created, "model": model,
                                                 "choices": [], "usage": _usage(usage)}) + "\n\n"
            except GenerationError as e:
                yield "data: " + json.dumps(ApiError(500, str(e), "server_error").body()) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def completions(request: Request):  # noqa: ANN202
        return await generate(request, chat=False)

    async def chat(request: Request):  # noqa: ANN202
        return await generate(request, chat=True)

    return Starlette(routes=[Route("/v1/models", handled(list_models), methods=["GET"]),
                             Route("/v1/completions", handled(completions), methods=["POST"]),
                             Route("/v1/chat/completions", handled(chat), methods=["POST"])])


async def _first(gen):  # noqa: ANN001, ANN202
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        return None


async def _chain(first: list, gen):  # noqa: ANN001, ANN202
    for c in first:
        yield c
    async for c in gen:
        yield c


class FrontServer:
    """uvicorn serving the front in a thread of its own (its own event loop); `port` once started."""

    def __init__(self, front: Front, host: str = "127.0.0.1", port: int = 0, ssl_certfile: str | None = None,
                 ssl_keyfile: str | None = None) -> None:
        import uvicorn

        config = uvicorn.Config(build_app(front), host=host, port=port, log_level="warning", lifespan="off",
                                ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, access_log=False)
        self.server = uvicorn.Server(config)
        self.host = host
        self.loop: asyncio.AbstractEventLoop | None = None
        self._done = None

    def start(self, timeout: float = 30.0) -> int:
        """uvicorn on the process's shared loop (llm_client.shared_loop: grpc's asyncio client
        works on one loop a process); the port it bound."""
        from .llm_client import shared_loop

        self.loop = shared_loop()
        self._done = asyncio.run_coroutine_threadsafe(self.server.serve(), self.loop)
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self._done.done() or time.monotonic() > deadline:
                err = self._done.exception() if self._done.done() else None
                raise RuntimeError(f"the OpenAI front did not start{f': {err}' if err else ''}")
            time.sleep(0.02)
        return self.server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        self.server.should_exit = True
        if self._done is not None:
            try:
                self._done.result(timeout=10)
            except Exception:  # noqa: BLE001 - stopping: what it ended with does not matter
                pass
