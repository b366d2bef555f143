"""Child process for the cold-load benchmark: seconds from file on disk to session ready and to
the first inference's output."""

import sys
import time

kind, path = sys.argv[1], sys.argv[2]
import numpy as np
import onnxruntime as ort

so = ort.SessionOptions()
if kind.endswith("-noprepack"):
    so.add_session_config_entry("session.disable_prepacking", "1")
if kind.startswith("mcpir"):
    from mcp_compiler.mcpir import read_mcpir
    from mcp_compiler.session import create_session

    t0 = time.perf_counter()
    sess = create_session(read_mcpir(path), so)
else:
    t0 = time.perf_counter()
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
i = sess.get_inputs()[0]
shape = [d if isinstance(d, int) else 1 for d in i.shape]
sess.run(None, {i.name: np.ones(shape, np.float32)})
t2 = time.perf_counter()
print(t1 - t0, t2 - t0)
