"""`mcp-cli generate`: a completion or chat from the terminal, streamed as it arrives, from a
served LLM entry (--url: gRPC stream) or an entry folder run in-process (its own runtime)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from mcp_compiler.cli.common import DebugOpt, JsonOpt, reporter, run
from mcp_compiler.errors import InvalidModelError, UsageError

from .commands_common import ConnectionFlags, command, with_connection


@command("generate", "mcp-cli generate repo/smol 'What is the capital of France?' --chat",
         "mcp-cli generate smol 'Once upon a time' --url 127.0.0.1:8001",
         "mcp-cli generate repo/smol 'A joke' --chat --temperature 0.8 --seed 7")
@with_connection(grpc_only=True, url_help="A Triton server serving MODEL (grpc://HOST:PORT); without it, MODEL is "
                                          "an entry folder run in this process.")
def generate(
    model: str = typer.Argument(..., help="An LLM entry folder (repo/NAME), or the model's name on --url."),
    prompt: str = typer.Argument(..., help="The prompt ('-': read it from standard input)."),
    chat: bool = typer.Option(False, "--chat", help="Send the prompt as a user message through the model's chat "
                              "template."),
    system: Optional[str] = typer.Option(None, "--system", help="With --chat: a system message first."),
    max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 (default): greedy; more: sampled."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling: the smallest set of tokens of this mass."),
    top_k: int = typer.Option(0, "--top-k", help="Sample among the k likeliest tokens (0: all)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the sampling (the same seed, the same text)."),
    stop: Optional[list[str]] = typer.Option(None, "--stop", help="A string that ends the text (repeatable)."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Go on past the end-of-sequence token."),
    conn: ConnectionFlags = None,
    json_out: bool = JsonOpt, debug: bool = DebugOpt,
) -> None:
    """Generate text with a decoder LLM entry, printing it as it streams. The text goes to standard
    output; with --json, one object at the end (text, token ids, finish reason, usage)."""
    rep = reporter(json_out)

    def body() -> None:
        from .llm_client import run as run_shared

        text = sys.stdin.read() if prompt == "-" else prompt
        if system is not None and not chat:
            raise UsageError("--system goes with --chat")
        sampling = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                    "ignore_eos": ignore_eos}
        if seed is not None:
            sampling["seed"] = seed
        if stop:
            sampling["stop"] = list(stop)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        kw = {"messages": messages} if chat else {"prompt": text}
        show = None if json_out else (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        c = conn.connection(required=False)
        if c is None:
            out = _in_process(Path(model), sampling, kw, show)
        else:
            out = run_shared(_served(c, model, sampling, kw, show))
        if json_out:
            rep.json(out)
        else:
            sys.stdout.write("\n")
            sys.stdout.flush()   # the text's end before the status line on stderr
            u = out["usage"] or {}
            rep.err.print(f"[{out['finish_reason']}: {u.get('prompt_tokens', '?')} prompt tokens "
                          f"({u.get('cached_tokens', 0)} cached), {u.get('completion_tokens', '?')} generated]",
                          markup=False)

    run(rep, debug, body)


async def _served(c, model: str, sampling: dict, kw: dict, show) -> dict:  # noqa: ANN001
    from .client import aio_client, server_error
    from .llm_client import GenerationError, stream

    out = {"text": "", "token_ids": [], "finish_reason": None, "usage": None}
    client = aio_client(c)
    try:
        async for chunk in stream(client, model, sampling=sampling, headers=c.headers(), **kw):
            if show and chunk.text:
                show(chunk.text)
            out["text"] += chunk.text
            out["token_ids"] += chunk.ids
            out["finish_reason"] = chunk.finish or out["finish_reason"]
            out["usage"] = chunk.usage or out["usage"]
    except GenerationError as e:
        raise UsageError(f"{model}: {e}") from None
    except Exception as e:  # noqa: BLE001 - unreachable, TLS, auth: one line
        if hasattr(e, "code") and hasattr(e, "details"):   # grpc.aio's error: its first line names nothing
            e = RuntimeError(f"{e.code().name}: {e.details()}")
        raise server_error(c, e, f"generating with {model}") from None
    finally:
        await client.close()
    return out


def _in_process(folder: Path, sampling: dict, kw: dict, show) -> dict:  # noqa: ANN001
    """The entry's own runtime, engine and tokenizer in this process (no server)."""
    import threading

    from .entry import read_config
    from .runtime import params as P
    from .verify import _latest_version, load_runtime

    if not folder.is_dir():
        raise UsageError(f"{folder}: not an entry folder (give --url to generate with a served model of that name)")
    cfg = read_config(folder)
    if P.GENERATION not in cfg.parameters:
        raise InvalidModelError(folder, "not an LLM generation entry (convert a GGUF or an ONNX decoder)")
    vdir = _latest_version(folder)
    rt = load_runtime(vdir)
    engine_mod, text_mod = (__import__(f"{rt.__name__}.{m}", fromlist=["x"]) for m in ("engine", "text"))
    model = rt.MCPIRModel(vdir / "model.mcpir")
    dec = rt.Decoder(model)
    meta = model.session.get_modelmeta().custom_metadata_map
    info = text_mod.TokenizerInfo.from_metadata(meta)
    if info is None:
        raise UsageError(f"{folder}: the entry has no tokenizer: a text prompt cannot be encoded")
    try:
        tok = text_mod.ChatTokenizer(info)
        prompt = tok.encode(tok.chat(kw["messages"]) if "messages" in kw else kw["prompt"])
    except ImportError:
        raise UsageError("generating needs the `tokenizers` package (pip install 'mcp-cli[llm]')") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    context = dec.context or 2048
    stops = sampling.pop("stop", [])
    s = engine_mod.Sampling(max_tokens=sampling["max_tokens"], temperature=sampling["temperature"],
                            top_p=sampling["top_p"], top_k=sampling["top_k"], seed=sampling.get("seed"),
                            ignore_eos=sampling["ignore_eos"])
    bs = 16
    tokens = min(context, -(-(len(prompt) + s.max_tokens) // bs) * bs)   # one slot, as long as this request
    pool = engine_mod.SlotPool(1, max(bs, tokens), bs, dec.layers, dec.kv_heads, dec.head_size)
    eng = engine_mod.Engine(model.session, pool, context=context, eos_ids=info.eos_ids, vocab=dec.vocab, max_queue=1)
    stream = text_mod.StreamText(tok.decode, stops)
    out = {"text": "", "token_ids": [], "finish_reason": None, "usage": None}
    done = threading.Event()

    def emit(event: dict) -> None:
        delta = stream.take(event)
        if "token" in event:
            out["token_ids"].append(event["token"])
        else:
            out["finish_reason"], out["usage"] = event["finish"], event["usage"]
            if "error" in event:
                out["error"] = event["error"]
            done.set()
        out["text"] += delta
        if show and delta:
            show(delta)

    try:
        eng.submit(engine_mod.Request(prompt, s, emit, lambda t: stream.stopped))
    except engine_mod.RequestError as e:
        raise UsageError(str(e)) from None
    try:
        while not done.wait(0.2):
            pass
    finally:
        eng.close()
    if out.get("error"):
        raise UsageError(out["error"])
    return out
