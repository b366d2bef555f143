"""The LLM peers of bench_llm.py, run in a benchmark venv of their own (torch, transformers,
llama-cpp-python: never the project's dependencies). Reads a JSON job on stdin, writes JSON.

job: {"peer": "transformers" | "llamacpp" | "genai", "gguf": PATH, "prompts": [[ids]], "steps": N,
      "threads": T, "speed": {"prompt": [ids], "decode": N} | null}; genai: "folder" (model.onnx and
      genai_config.json: the entry's ONNX decoder, `convert GGUF -o model.onnx`) instead of "gguf".
"""

import json
import sys
import time
from pathlib import Path


def transformers_tokens(job: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(job["threads"])
    g = Path(job["gguf"])
    model = AutoModelForCausalLM.from_pretrained(g.parent, gguf_file=g.name, torch_dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for ids in job["prompts"]:
            x = torch.tensor([ids])
            r = model(x, use_cache=True)
            past, toks = r.past_key_values, []
            for _ in range(job["steps"]):
                nxt = int(r.logits[0, -1].argmax())
                toks.append(nxt)
                r = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = r.past_key_values
            out.append(toks)
    import transformers

    return {"tokens": out, "version": f"transformers {transformers.__version__}, torch {torch.__version__}"}


def llamacpp(job: dict) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=job["gguf"], n_threads=job["threads"], n_threads_batch=job["threads"],
                          n_ctx=2048, n_batch=512, verbose=False, logits_all=False)
    res: dict = {"version": f"llama-cpp-python {llama_cpp.__version__}"}
    if job.get("prompts"):
        toks_all = []
        for ids in job["prompts"]:
            llm.reset()
            toks = []
            for t in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
                toks.append(int(t))
                if len(toks) == job["steps"]:
                    break
            toks_all.append(toks)
        res["tokens"] = toks_all
    sp = job.get("speed")
    if sp:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(sp["prompt"])
        t1 = time.perf_counter()
        n = 0
        for _ in llm.generate([], top_k=1, temp=0.0, repeat_penalty=1.0, reset=False):
            n += 1
            if n == sp["decode"]:
                break
        t2 = time.perf_counter()
        res["prefill_tps"] = len(sp["prompt"]) / (t1 - t0)
        res["decode_tps"] = n / (t2 - t1)
    return res


def genai(job: dict) -> dict:
    """onnxruntime-genai on mcp-cli's ONNX decoder (its cache shared past/present, greedy)."""
    import onnxruntime_genai as og

    model = og.Model(job["folder"])
    res: dict = {"version": f"onnxruntime-genai {og.__version__}"}

    def run(ids: list[int], n: int, through_eos: bool = False) -> tuple[list[int], float, float]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + n + 1, do_sample=False,
                                  **({"min_length": len(ids) + n} if through_eos else {}))
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(ids)
        t1 = time.perf_counter()
        out = []
        for _ in range(n):
            if gen.is_done():   # its end-of-sequence token: the tokens compared are those before
                break
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return out, t1 - t0, time.perf_counter() - t1

    if job.get("prompts"):
        res["tokens"] = [run(ids, job["steps"])[0] for ids in job["prompts"]]
    sp = job.get("speed")
    if sp:
        run(sp["prompt"][:8], 4)   # its first run's allocations, not measured
        got, pre, dec = run(sp["prompt"], sp["decode"], through_eos=True)   # every token, as the others
        res["prefill_tps"], res["decode_tps"] = len(sp["prompt"]) / pre, len(got) / dec   # n calls / time: favours it
    return res


if __name__ == "__main__":
    job = json.loads(sys.stdin.read())
    fn = {"transformers": transformers_tokens, "llamacpp": llamacpp, "genai": genai}[job["peer"]]
    print(json.dumps(fn(job)))
