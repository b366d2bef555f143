"""`verify` of a decoder LLM: the entry's own runtime against a reference, token for token.

The reference is onnxruntime on the original as a user runs it: for an ONNX decoder the file
itself; for a GGUF, the same decoder graph with every weight dequantized to float32 by gguf's own
dequantizer (what transformers computes from the GGUF). On prompts made from the model's chat
template, both prefill the prompt and then decode greedily, each on its own tokens: the prompt's
last logits must agree within the tolerance, and the greedy tokens be identical for every step.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import VerificationError

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers greater than 100.", "Explain in one sentence what a compiler does.",
           "Translate 'good morning' into Spanish.", "What is 17 times 23?",
           "Name a famous painting by Leonardo da Vinci.", "Give me a synonym for 'happy'.")
STEPS = 16
# float32 activations against float32 weights in another summation order: logits agree to ~1e-4
# (measured on SmolLM2-135M Q4_1: max abs 8e-5 .. 1.7e-4 over 4 prompts, logits of magnitude ~20)
ATOL, COSINE = 5e-3, 0.99999


@dataclass
class LLMVerifyReport:
    repository: str
    reference: str
    prompts: int
    steps: int
    atol: float
    cosine: float
    results: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    execution: str = "onnxruntime/f32"
    seconds: float = 0.0
    kind: str = "llm"

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r["ok"] for r in self.results)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}

    def raise_if_failed(self) -> None:
        bad = [r for r in self.results if not r["ok"]]
        if not self.results:
            raise VerificationError(f"{self.repository}: no prompt was checked")
        if bad:
            r = bad[0]
            raise VerificationError(f"{self.repository}: {len(bad)} of {len(self.results)} prompts differ from the "
                                    f"reference ({self.reference}); first: prompt {r['index']}: {r['why']}")


class OrtRunner:
    """An onnxruntime session as the decoder runtime's runner."""

    def __init__(self, model: bytes | str, threads: int | None = None) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = threads
        self.session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, feeds: dict, outputs: list[str]) -> list:
        names = set(self.input_names)
        return self.session.run(outputs, {k: v for k, v in feeds.items() if k in names})


def reference_runner(original: Path, threads: int | None = None) -> tuple[OrtRunner, str]:
    from .gguf_file import is_gguf_file

    if is_gguf_file(original):
        from ..frontend.gguf import gguf_decoder

        proto = gguf_decoder(original, last_logits=True, dequantized=True)
        return OrtRunner(proto.SerializeToString(), threads), \
            "onnxruntime on the GGUF's decoder with float32 weights (gguf's dequantizer)"
    return OrtRunner(str(original), threads), "onnxruntime on the original (default optimization)"


def prompts_for(tokenizer, count: int, vocab: int | None = None) -> list[list[int]]:  # noqa: ANN001 - ChatTokenizer or None
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(count)]
    if tokenizer is None:   # ids drawn within the vocabulary (its logits' width)
        rng = np.random.default_rng(0)
        return [[int(t) for t in rng.integers(min(3, (vocab or 1000) - 1), vocab or 1000, 12 + i)] for i in range(count)]
    if tokenizer.info.chat_template:
        return [tokenizer.encode(tokenizer.chat([{"role": "user", "content": t}])) for t in texts]
    return [tokenizer.encode(t) for t in texts]


def compare(entry_decoder, reference_decoder, prompts: list[list[int]], steps: int, stop: set[int],  # noqa: ANN001
            atol: float = ATOL, cosine: float = COSINE) -> list[dict]:
    from mcp_compiler.targets.triton.runtime.decoder import greedy

    results = []
    for i, ids in enumerate(prompts):
        got_l: list = []
        want_l: list = []
        got = greedy(entry_decoder, ids, steps, stop, got_l)
        want = greedy(reference_decoder, ids, steps, stop, want_l)
        a, b = got_l[0].astype(np.float64), want_l[0].astype(np.float64)
        finite = bool(np.isfinite(a).all() and np.isfinite(b).all())
        max_abs = float(np.abs(a - b).max()) if finite else float("nan")
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)) if finite else float("nan")
        first = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y),
                     None if len(got) == len(want) else min(len(got), len(want)))
        why = []
        if not finite:
            why.append("non-finite logits")
        elif max_abs > atol or cos < cosine:
            why.append(f"prompt logits max abs {max_abs:.3g} (atol {atol}), cosine {cos:.6f} (>= {cosine})")
        if first is not None:
            why.append(f"greedy tokens differ from step {first} ({got[first:first + 1]} vs {want[first:first + 1]})")
        results.append({"index": i, "prompt_tokens": len(ids), "steps": len(want), "tokens": got, "reference_tokens": want,
                        "logits_max_abs": max_abs, "logits_cosine": cos, "first_difference": first,
                        "ok": not why, "why": "; ".join(why)})
    return results


def verify_llm(original: str | os.PathLike, model_file: Path, runtime, *, prompts: int = 4,  # noqa: ANN001
               steps: int = STEPS, repository: str = "", threads: int | None = None) -> LLMVerifyReport:
    """The entry's model (model_file, run by `runtime`: the entry's mcp_runtime package) against
    the reference on `prompts` chat prompts, `steps` greedy tokens each."""
    from .spec import GENERATION_KEY, TOKENIZER_KEY
    from .tokenizer import ChatTokenizer, TokenizerInfo

    t0 = time.perf_counter()
    model = runtime.MCPIRModel(model_file, intra_op_threads=threads)
    entry = runtime.Decoder(model)
    ref_runner, label = reference_runner(Path(original), threads)
    reference = runtime.Decoder(ref_runner)
    meta = model.session.get_modelmeta().custom_metadata_map
    tok = None
    warnings = []
    if TOKENIZER_KEY in meta:
        tok = ChatTokenizer(TokenizerInfo.from_json(meta.get(GENERATION_KEY, "{}"), meta[TOKENIZER_KEY]))
    else:
        warnings.append("the entry has no tokenizer: the prompts are token ids drawn at random")
    stop = set(tok.info.eos_ids) if tok else set()
    report = LLMVerifyReport(repository, label, prompts, steps, ATOL, COSINE, warnings=warnings)
    report.results = compare(entry, reference, prompts_for(tok, prompts, entry.vocab), steps, stop)
    report.seconds = round(time.perf_counter() - t0, 3)
    return report
