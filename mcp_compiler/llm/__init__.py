"""Decoder LLMs: GGUF in, an ONNX decoder with its KV cache, tokenizer and chat template, checks."""
