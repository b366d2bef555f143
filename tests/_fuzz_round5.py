"""A seeded fuzzer for the surfaces of hardening round 5 (issue 62), run in a process of its own:
`python tests/_fuzz_round5.py SEED RUNS DIR`. Each run draws one surface and one hostile change:

- cache: an OpenVINO entry's kept files (saved model xml/bin, their digests, compiled blobs)
  truncated, flipped, emptied, swapped for another's, replaced by a folder or a link; the next
  load must give the model's own outputs (equal to a load without any cache) or an MCPIRError.
- params: JSON text for the config's recorded parameters (mcp_budget, mcp_state, ...), nested,
  huge, NaN, wrong types; only the documented errors (UsageError, InvalidModelError) may come out.
- tls: PEM files (real ones, then cut, flipped, swapped, relabelled, encrypted, expired); only
  UsageError from the checks, and a pair that passes must be a real matching pair.
- argo: deploy --kserve's rollout options (steps, p99, pause, Prometheus URL, canary percent,
  the analysis' bounds, --kube-version); the weights that pass are whole pods of the Rollout;
  only UsageError, and what passes is written as checked (no control characters or braces).

A run passes when nothing else is raised, nothing is written outside DIR and no run hangs (each
surface's work is bounded). Prints one JSON object: the runs per surface and each failure."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    how = rng.choice(["truncate", "flip", "empty", "append", "zero"])
    if how == "truncate" or not data:
        return data[: rng.randrange(len(data) + 1)] if data else b""
    if how == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    if how == "empty":
        return b""
    if how == "append":
        return data + os.urandom(rng.randint(1, 64))
    i = rng.randrange(len(data))
    return data[:i] + b"\0" * min(64, len(data) - i) + data[i + 64:]


class Cache:
    def __init__(self, d: Path) -> None:
        from mcp_compiler import CompileOptions, compile_model
        from mcp_compiler.targets.triton.verify import load_runtime

        self.d = d
        compile_model(ROOT / "golden_models" / "convnet" / "model.onnx", d / "repo", CompileOptions.for_target(
            "triton-v1.12", "m"))
        self.vdir = d / "repo" / "m" / "1"
        self.rt = load_runtime(self.vdir)
        self.x = np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32)
        plain = self._load(None)
        self.want = plain.run({plain.input_names[0]: self.x})[0]
        self.cache = d / "cache"

    def _load(self, cache):
        return self.rt.MCPIRModel(self.vdir / "model.mcpir", engine="openvino", precision="f32",
                                  cache_dir=None if cache is None else str(cache))

    def run(self, rng: random.Random) -> None:
        if not self.cache.exists() or rng.random() < 0.3:
            shutil.rmtree(self.cache, ignore_errors=True)
            self.cache.mkdir()
            self._load(self.cache)   # a warm cache to spoil
        kept = sorted(p for p in self.cache.rglob("*") if p.is_file() and not p.is_symlink())
        for p in rng.sample(kept, k=min(len(kept), rng.randint(1, 3))):
            if not p.is_file() or p.is_symlink():   # (made a folder or a link earlier in this run)
                continue
            how = rng.choice(["bytes", "bytes", "swap", "dir", "link", "remove"])
            if how == "bytes":
                p.write_bytes(_mutate_bytes(p.read_bytes(), rng))
            elif how == "swap":
                other = rng.choice(kept)
                if other.is_file() and other != p:
                    p.write_bytes(other.read_bytes())
            elif how == "dir":
                p.unlink()
                p.mkdir()
            elif how == "link":
                p.unlink()
                os.symlink("/etc/hostname" if rng.random() < 0.5 else str(self.d / "missing"), p)
            else:
                p.unlink()
        try:
            m = self._load(self.cache)
        except self.rt.MCPIRError:
            return
        got = m.run({m.input_names[0]: self.x})[0]
        if not np.allclose(got, self.want, rtol=1e-4, atol=1e-5):
            raise AssertionError(f"served other outputs after a spoiled cache (max abs {np.abs(got - self.want).max()})")


HOSTILE_JSON = ['{"cos": -1}', '{"cos": 0.9999}', '{"rel": 1e308}', '{"cos": NaN}', "Infinity", "[" * 5000,
                "{" * 3000 + "}" * 3000, '{"cos": ' + "9" * 5000 + "}", '{"cos": true}', "[]", "{}", '"x"', "null",
                '[{"input": 1}]', '[{"input": "a", "output": "b"}]', "\x00", "\ud800", '{"a":' * 200]


def _params(rng: random.Random) -> None:
    from mcp_compiler.errors import InvalidModelError, UsageError
    from mcp_compiler.files import parse_json
    from mcp_compiler.targets.triton.verify import _recorded_budget

    text = rng.choice(HOSTILE_JSON)
    if rng.random() < 0.5:
        text = _mutate_bytes(text.encode("utf-8", "surrogatepass"), rng).decode("utf-8", "replace")
    try:
        parse_json(text, "fuzz", kind=rng.choice([None, dict, list]))
    except UsageError:
        pass
    try:
        _recorded_budget({"mcp_budget": text, "mcp_quantization_level": rng.choice(["none", "fp16", "int4"])},
                         Path("entry"), given=rng.random() < 0.5)
    except (UsageError, InvalidModelError):
        pass


class Tls:
    def __init__(self, d: Path) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        import _tls

        self.d = d / "tls"
        self.d.mkdir()
        self.t = _tls
        self.good = _tls.server_pair(self.d, name="good")
        self.other = _tls.server_pair(self.d, name="other")
        self.expired = _tls.server_pair(self.d, days=-1, start_days=-9, name="expired")
        self.enc = _tls.write_key(self.d / "enc.key", _tls.key(), password=b"pw")

    def run(self, rng: random.Random) -> None:
        from mcp_compiler.errors import UsageError
        from mcp_compiler.targets.triton import pem

        cert_src = rng.choice([self.good[0], self.other[0], self.expired[0], self.good[1]])
        key_src = rng.choice([self.good[1], self.other[1], self.enc, self.good[0]])
        cert, key = self.d / "c.pem", self.d / "k.pem"
        for src, dst in ((cert_src, cert), (key_src, key)):
            data = src.read_bytes()
            if rng.random() < 0.6:
                data = _mutate_bytes(data, rng)
            if rng.random() < 0.1:
                data = data.replace(b"CERTIFICATE", b"PRIVATE KEY") if b"CERT" in data else data.replace(
                    b"PRIVATE KEY", b"CERTIFICATE")
            dst.write_bytes(data)
        try:
            certs = pem.pair(cert, key)   # passing: parsed, within dates, the key the certificate's
        except UsageError:
            return
        if not certs:
            raise AssertionError("a certificate file with no certificate passed")


def _argo(rng: random.Random) -> None:
    from mcp_compiler.errors import UsageError
    from mcp_compiler.targets.triton.kserve import MAX_CANARY_PODS, KServeRequest, _check_request, canary_replicas

    steps = rng.choice([[10, 30, 100], [100], [0, 100], [50, 30, 100], [10, 30], [], [10, 10, 100], [1, 2, 3, 100],
                        [3, 100], [25, 50, 100], [20, 40, 100], [33, 100]])
    req = KServeRequest(
        storage_uri=rng.choice(["s3://b/repo", "s3://", "pvc://c/../x", "gs://b/r\n", "s3://b/{version}/r",
                                "s3://b/{x}/r", "gs://b/{version", "s3://b/{{version}}"]),
        canary_steps=steps if rng.random() < 0.9 else None,
        max_p99_ms=rng.choice([None, 50.0, 0.0, -1.0, 1e-300, 1e300, float("nan"), float("inf"), 0.1, 1e6]),
        prometheus_url=rng.choice(["http://p:9090", " http://p:9090\n", "http://p/{{args.x}}", "p:9090", "ftp://p",
                                   "http://" + "p" * 5000, "http://u:pw@p:1", "http://p:99999", "http://p:1/\x01", ""]),
        step_pause=rng.choice(["5m", "30s", "99999h", "25h", "24h", "0s", "1d", "", "5m\n", "٣m"]),
        canary_percent=rng.choice([None, None, 10, 0, 100, -5]),
        analysis_min_requests=rng.choice([50, 50, 0, -1, 1, 10**10]),
        analysis_failure_limit=rng.choice([1, 1, 0, -1, 1001]), analysis_count=rng.choice([None, None, 0, 1, 100_001]),
        kube_version=rng.choice(["1.30.0", "1.30", "1.20", "v1.28.3", "1.x", "", "1.99", "1.25\n", "1.3" + "0" * 50]))
    try:
        _check_request(req)
    except UsageError:
        return
    from mcp_compiler.targets.triton.kserve import revision_uri

    if any(c in revision_uri(req.storage_uri, "v1-0123456789ab") for c in "{}"):
        raise AssertionError(f"--storage-uri {req.storage_uri!r} passed with braces left in it")
    if req.canary_steps is None:   # (no rollout: the URL is not used, nor written)
        return
    pods = canary_replicas(req.canary_steps)
    if pods > MAX_CANARY_PODS or any(w * pods % 100 for w in req.canary_steps):
        raise AssertionError(f"--canary-steps {req.canary_steps} passed with weights {pods} pods do not reach")
    url = req.prometheus_url
    bad = [c for c in url if ord(c) < 33 or c in "{}\"'\\<>`"]
    if bad or len(url) > 2048 or url != url.strip():
        raise AssertionError(f"--prometheus-url {url!r} passed unchecked")


def main(seed: int, runs: int, d: Path) -> dict:
    rng = random.Random(seed)
    surfaces = {"params": _params, "argo": _argo}
    try:
        surfaces["tls"] = Tls(d).run
    except ImportError:
        pass
    import importlib.util

    if importlib.util.find_spec("openvino") is not None:   # (not imported here: the runtime imports it, telemetry off)
        surfaces["cache"] = Cache(d).run
    counts = dict.fromkeys(surfaces, 0)
    failures = []
    for i in range(runs):
        name = rng.choice(sorted(surfaces))
        counts[name] += 1
        try:
            surfaces[name](random.Random(f"{seed}:{i}"))
        except RecursionError:
            failures.append({"run": i, "surface": name, "error": "RecursionError"})
        except Exception as e:  # noqa: BLE001 - whatever escapes is the finding
            failures.append({"run": i, "surface": name, "error": f"{type(e).__name__}: {str(e)[:200]}",
                             "where": traceback.format_exc().splitlines()[-3:]})
    return {"seed": seed, "runs": runs, "per_surface": counts, "failures": failures}


if __name__ == "__main__":
    seed, runs, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    os.environ.setdefault("HOME", str(folder))
    print(json.dumps(main(seed, runs, folder)))
