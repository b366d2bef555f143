"""Child process for the cold-load benchmark: prints seconds from file on disk to session ready."""

import sys
import time

kind, path = sys.argv[1], sys.argv[2]
import onnxruntime as ort  # noqa: E402  (imports are not part of what is measured)

if kind == "mcpir":
    from mcp_compiler.mcpir import read_mcpir
    from mcp_compiler.session import create_session

    t0 = time.perf_counter()
    create_session(read_mcpir(path))
else:
    t0 = time.perf_counter()
    ort.InferenceSession(path, providers=["CPUExecutionProvider"])
print(time.perf_counter() - t0)
