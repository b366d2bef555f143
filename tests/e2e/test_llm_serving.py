"""A decoder LLM served as a generation entry on the real local tritonserver (decoupled, gRPC
streams): streaming order and the final response, greedy served = in-process greedy with
several streams at once, prefix hits counted, cancelled streams' blocks freed, bad requests
refused one by one while the server serves the others, and the OpenAI client unchanged against
`serve --openai-port`. The small LLaMA-shaped GGUF of tests/llm (random weights)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from _tiny import write_tiny_gguf

pytestmark = pytest.mark.slow  # a real Triton

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed: no tritonserver")

CLI = [sys.executable, "-m", "mcp_compiler.cli"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    d = tmp_path_factory.mktemp("llm")
    gguf = write_tiny_gguf(d / "tiny.gguf")
    r = subprocess.run([*CLI, "convert", str(gguf), "-t", "triton-v1.12", "-o", str(d / "repo"), "--name", "tiny",
                        "--kv-cache-bytes", "4MiB", "--kv-block-size", "4", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return d / "repo"


@pytest.fixture(scope="module")
def server(repo):
    from mcp_compiler.targets.triton.serve import TritonServer

    with TritonServer(repo, mode="explicit", load_all=True) as s:
        yield s


@pytest.fixture(scope="module")
def local(repo):
    """The entry's own runtime in this process: in-process greedy, the tokenizer."""
    from mcp_compiler.targets.triton.verify import load_runtime

    rt = load_runtime(repo / "tiny" / "1")
    model = rt.MCPIRModel(repo / "tiny" / "1" / "model.mcpir")
    return rt, rt.Decoder(model)


def _run(coro):
    from mcp_compiler.targets.triton.llm_client import run

    return run(coro)   # grpc's asyncio client: one loop a process


async def _collect(url, **kw):
    import tritonclient.grpc.aio as aio

    from mcp_compiler.targets.triton.llm_client import stream

    c = aio.InferenceServerClient(url)
    try:
        return [chunk async for chunk in stream(c, "tiny", **kw)]
    finally:
        await c.close()


def _metric(server, name):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{") and 'model="tiny"' in line]
    return vals[0] if vals else None


def _serve(repo, *extra):
    proc = subprocess.Popen([*CLI, "serve", str(repo), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                             *extra, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    text = ""
    while True:   # one JSON object, once the server is ready
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        text += line
        if line.startswith("}"):
            return proc, json.loads(text)


def test_streams_equal_in_process_greedy_and_end_with_one_final_response(server, local):
    from mcp_compiler.targets.triton.runtime.decoder import greedy

    _, dec = local
    prompts = [[1, 5, 7], [1, 9, 11, 13, 15, 17, 19], list(range(3, 30))]

    async def all_at_once():
        return await asyncio.gather(*[_collect(server.grpc_url, ids=p, sampling={"max_tokens": 10}) for p in prompts])

    for p, chunks in zip(prompts, _run(all_at_once())):
        assert [c.ids for c in chunks[:-1]] == [[t] for t in greedy(dec, p, 10)]   # one response a token, in order
        last = chunks[-1]
        assert last.finish == "length" and last.ids == [] and last.usage["completion_tokens"] == 10
        assert all(c.finish == "" for c in chunks[:-1])


def test_text_prompt_and_chat_use_the_entrys_tokenizer(server):
    chunks = _run(_collect(server.grpc_url, prompt="hello", sampling={"max_tokens": 4}))
    assert chunks[-1].usage["prompt_tokens"] == 5 and len(chunks) == 5
    chat = _run(_collect(server.grpc_url, messages=[{"role": "user", "content": "hi"}], sampling={"max_tokens": 3}))
    assert chat[-1].usage["prompt_tokens"] > 5   # the template's tokens around the message
    seeded = [_run(_collect(server.grpc_url, prompt="abc", sampling={"max_tokens": 8, "temperature": 1.0, "seed": 5}))
              for _ in range(2)]
    assert [c.ids for c in seeded[0]] == [c.ids for c in seeded[1]]   # seeded sampling is reproducible


def test_a_repeated_prefix_is_counted_and_computed_once(server):
    prompt = list(range(3, 40))
    before = _metric(server, "mcp_prefix_cache_hit_tokens_total") or 0
    first = _run(_collect(server.grpc_url, ids=prompt, sampling={"max_tokens": 3}))
    again = _run(_collect(server.grpc_url, ids=prompt + [50], sampling={"max_tokens": 3}))
    assert again[-1].usage["cached_tokens"] >= 36 - 4 and [c.ids for c in again[:1]] != []
    assert first[-1].usage["cached_tokens"] <= again[-1].usage["cached_tokens"]
    deadline = time.monotonic() + 30
    while (_metric(server, "mcp_prefix_cache_hit_tokens_total") or 0) - before < again[-1].usage["cached_tokens"]:
        assert time.monotonic() < deadline, "the prefix hits never reached the metrics"
        time.sleep(0.2)


def test_streams_dropped_mid_generation_free_their_blocks(server):
    async def drop_after_one():
        import tritonclient.grpc.aio as aio

        from mcp_compiler.targets.triton.llm_client import stream

        c = aio.InferenceServerClient(server.grpc_url)
        try:
            gens = [stream(c, "tiny", ids=[1, 2, 3 + i], sampling={"max_tokens": 100, "ignore_eos": True})
                    for i in range(6)]
            for g in gens:
                await g.__anext__()
            for g in gens:
                await g.aclose()          # cancels the request on the server
        finally:
            await c.close()

    _run(drop_after_one())
    deadline = time.monotonic() + 60
    while _metric(server, "mcp_kv_cache_blocks_used") != 0:
        assert time.monotonic() < deadline, "cancelled streams kept their blocks"
        time.sleep(0.2)
    assert _metric(server, "mcp_kv_cache_blocks_total") > 0


@pytest.mark.parametrize("kw, expect", [
    ({"prompt": ""}, "empty"),
    ({"prompt": "x", "sampling": {"max_tokens": 0}}, "max_tokens"),
    ({"prompt": "x", "sampling": {"max_tokens": 10**12}}, "max_tokens"),
    ({"prompt": "x", "sampling": {"temperature": -1}}, "temperature"),
    ({"prompt": "x", "sampling": {"stop": ["a"] * 10_000}}, "stop"),
    ({"prompt": "x", "sampling": {"bogus": 1}}, "unknown sampling parameter"),
    ({"prompt": "x" * (10 << 20)}, "bytes"),
    ({"ids": list(range(1, 120)), "sampling": {"max_tokens": 50}}, "context"),
    ({"ids": [1, 2], "prompt": "x"}, "one of"),
    ({"prompt": "\udcff"}, "UTF-8"),
])
def test_bad_requests_get_one_error_and_the_server_serves_the_next(server, kw, expect):
    from mcp_compiler.targets.triton.llm_client import GenerationError

    with pytest.raises(GenerationError, match=expect):
        _run(_collect(server.grpc_url, **kw))
    ok = _run(_collect(server.grpc_url, ids=[1, 2], sampling={"max_tokens": 2}))
    assert ok[-1].finish == "length"


def test_openai_client_against_serve_openai_port(repo, local):
    openai = pytest.importorskip("openai")
    from mcp_compiler.targets.triton.runtime.decoder import greedy

    rt, dec = local
    proc, info = _serve(repo, "--openai-port", "0")
    try:
        assert info["openai_models"] == ["tiny"], info
        c = openai.OpenAI(base_url=info["openai"], api_key="unused")
        assert [m.id for m in c.models.list().data] == ["tiny"]
        from mcp_compiler.targets.triton.runtime.text import ChatTokenizer, TokenizerInfo

        meta = dec.runner.session.get_modelmeta().custom_metadata_map
        tok = ChatTokenizer(TokenizerInfo.from_metadata(meta))
        want = tok.decode(greedy(dec, tok.encode("hello"), 6))
        r = c.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0,
                                 extra_body={"ignore_eos": True})   # vLLM's extension
        assert r.choices[0].text == want and r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
        parts, usage = [], None
        for ch in c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                            temperature=0, stream=True, stream_options={"include_usage": True}):
            if ch.choices and ch.choices[0].delta.content:
                parts.append(ch.choices[0].delta.content)
            usage = ch.usage or usage
        whole = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                          temperature=0)
        assert "".join(parts) == whole.choices[0].message.content and usage.completion_tokens == 5
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="nope", prompt="x", max_tokens=2)
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            c.completions.create(model="tiny", prompt="x", max_tokens=0)
        with pytest.raises(openai.BadRequestError, match="n = 1"):
            c.completions.create(model="tiny", prompt="x", max_tokens=2, n=2)
        assert c.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)


def test_deploy_bench_and_generate_against_the_server(repo, server):
    url = f"grpc://{server.grpc_url}"

    def cli(*args):
        r = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr + r.stdout
        return json.loads(r.stdout)

    d = cli("deploy", str(repo / "tiny"), "--url", url, "--name", "tiny2")
    assert d["ok"] and d["smoke_seconds"] is not None      # one generated token over the stream
    r = subprocess.run([*CLI, "deploy", str(repo / "tiny"), "--url", f"http://{server.http_url}", "--name", "tiny3"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "gRPC" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    b = cli("bench", "tiny2", "--url", url, "-c", "1,2", "--prompt-words", "3", "--output-tokens", "4",
            "--shared-prefix", "4", "--metrics-url", f"http://{server.metrics_url}")
    assert b["kind"] == "llm" and [p["concurrency"] for p in b["points"]] == [1, 2]
    assert all(p["errors"] == 0 and p["requests"] > 0 and p["output_tokens"] == 4 for p in b["points"])
    assert b["points"][1]["prefix_hit_rate"] > 0          # the shared words' blocks were found again
    g = cli("generate", "tiny2", "hello", "--url", url, "--max-tokens", "3", "--ignore-eos")
    assert len(g["token_ids"]) == 3 and g["finish_reason"] == "length" and g["usage"]["prompt_tokens"] == 5


def test_tune_an_llm_entry_for_a_time_between_tokens_slo(repo, tmp_path):
    import shutil

    entry = tmp_path / "repo" / "tiny"
    shutil.copytree(repo / "tiny", entry)
    before = (entry / "config.pbtxt").read_text()
    r = subprocess.run([*CLI, "tune", str(entry), "--slo-p99-ms", "5000", "-c", "4", "--confirm-pairs", "3",
                        "--prompt-words", "3", "--output-tokens", "8", "--apply", "--json"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kind"] == "llm" and out["best"] is not None and [t["max_running"] for t in out["trials"]][:3] == [1, 2, 4]
    assert all(t["errors"] == 0 for t in out["trials"])
    changed = (entry / "config.pbtxt").read_text() != before
    assert changed == bool(out["applied"]) and (not out["applied"] or out["confirmed"])   # applied only when confirmed
    r = subprocess.run([*CLI, "tune", str(entry), "--slo-p99-ms", "0.000001", "-c", "2", "--prompt-words", "3",
                        "--output-tokens", "8", "--json"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 1 and "no setting met" in json.loads(r.stdout)["error"]["message"]


def test_traced_generation_has_queue_prefill_and_decode_spans(repo, tmp_path):
    pytest.importorskip("opentelemetry.sdk")
    trace = tmp_path / "trace.json"
    proc, info = _serve(repo, "--trace", f"file={trace}")
    try:
        url = info["grpc"].split("://", 1)[1]
        for p in ([1, 5, 7], [1, 9]):
            assert _run(_collect(url, ids=p, sampling={"max_tokens": 3}))[-1].finish == "length"
        runtime = tmp_path / "trace.json.runtime.jsonl"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (runtime.exists() and "mcp.decode" in runtime.read_text()):
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    names = [json.loads(line)["name"] for line in runtime.read_text().splitlines()]
    assert {"mcp.queue", "mcp.prefill", "mcp.decode"} <= set(names), names
