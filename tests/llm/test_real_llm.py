"""The real LLM of golden_models/zoo.yaml (SmolLM2-135M-Instruct, Q4_1 GGUF from its pinned
wheel): converts with --verify, stays about the GGUF's size, answers as the model does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _helpers import zoo_model

pytestmark = pytest.mark.slow
pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[llm]')")


def test_real_gguf_converts_verifies_and_answers(tmp_path):
    gguf = zoo_model("smollm2_135m_q4_1")
    r = subprocess.run([sys.executable, "-m", "mcp_compiler.cli", "convert", str(gguf), "-t", "triton-v1.12",
                        "-o", str(tmp_path / "repo"), "--name", "smol", "--verify", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    v = rep["verification"]
    assert v["kind"] == "llm" and v["ok"] and all(x["first_difference"] is None for x in v["results"])
    entry = tmp_path / "repo" / "smol"
    size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
    assert size <= 1.15 * gguf.stat().st_size, (size, gguf.stat().st_size)

    from mcp_compiler.llm.spec import GENERATION_KEY, TOKENIZER_KEY
    from mcp_compiler.llm.tokenizer import ChatTokenizer, TokenizerInfo
    from mcp_compiler.targets.triton.verify import load_runtime

    rt = load_runtime(entry / "1")
    model = rt.MCPIRModel(entry / "1" / "model.mcpir")
    meta = model.session.get_modelmeta().custom_metadata_map
    tok = ChatTokenizer(TokenizerInfo.from_json(meta[GENERATION_KEY], meta[TOKENIZER_KEY]))
    ids = tok.encode(tok.chat([{"role": "user", "content": "What is the capital of France?"}]))
    out = rt.greedy(rt.Decoder(model), ids, 16, set(tok.info.eos_ids))
    assert "Paris" in tok.decode(out)
