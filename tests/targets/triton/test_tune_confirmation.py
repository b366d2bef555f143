"""tune's confirmation, with a fake server (no Triton): settings that are all the same apart from
noise are never confirmed (so --apply writes nothing); one that truly doubles throughput is; settings
the same on this machine are measured once; the bootstrap interval covers the median."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from mcp_compiler.targets.triton import tune as T
from mcp_compiler.targets.triton.loadgen import Load, Point


def _point(tp: float) -> Point:
    return Point("concurrency 8", 8, None, 1, int(tp), 1.0, tp, tp, 1.0, 1.5, 2.0, 1.0, 0, 0, None, 0.1, 0.5, 1.0,
                 0.3, 3, True)


class _Fake:
    """A served model whose throughput depends on the loaded setting only through `gain`."""

    def __init__(self, gain, seed: int = 0) -> None:
        from tritonclient.grpc import model_config_pb2 as mc

        self.gain, self.rng = gain, np.random.default_rng(seed)
        self.loaded: dict[str, T.Setting] = {}
        cfg = mc.ModelConfig(name="m", max_batch_size=8)
        cfg.dynamic_batching.SetInParent()
        cfg.input.add(name="x", data_type=mc.TYPE_FP32, dims=[4])
        self.config, self.measured = cfg, []

    def install(self, monkeypatch) -> None:
        import json

        from google.protobuf import json_format
        from tritonclient.grpc import model_config_pb2 as mc

        from mcp_compiler.targets.triton.bench import Served

        @contextlib.contextmanager
        def served(entry, conn, **kw):
            yield Served(None, "m", self.config, {"x": np.zeros((1, 4), np.float32)})

        def load_model(s, config_json=None, files=None):
            cfg = json_format.ParseDict(json.loads(config_json), mc.ModelConfig()) if config_json else self.config
            self.loaded[s.name] = T.Setting.of(cfg)

        def measure_points(s, loads, **kw):
            setting = self.loaded[s.name]
            self.measured.append(setting)
            return [_point(1000.0 * self.gain(setting) * (1 + 0.08 * self.rng.standard_normal()))]

        monkeypatch.setattr(T, "served", served)
        monkeypatch.setattr(T, "load_model", load_model)
        monkeypatch.setattr(T, "measure_points", measure_points)
        monkeypatch.setattr(T, "unload_model", lambda s: None)
        monkeypatch.setattr(T, "_batchable", lambda entry: True)
        monkeypatch.setattr(T, "_check_execution", lambda entry: None)   # (no entry on disk)
        monkeypatch.setattr(T.Entry, "read", classmethod(lambda cls, e, v=None: cls(e, None, 1, None, {})))


def _tune(cores: int = 2) -> T.TuneReport:
    return T.tune("entry", Load(concurrency=8), 100.0, budget_s=10_000, window_s=0.1, cores=cores)


@pytest.mark.parametrize("seed", range(5))
def test_noise_alone_is_never_confirmed(monkeypatch, seed):
    fake = _Fake(lambda s: 1.0, seed)
    fake.install(monkeypatch)
    r = _tune()
    if r.best is not None and r.best.setting != r.baseline.setting:
        c = r.best.confirmation
        assert c is not None and len(c["pairs"]) == T.CONFIRM_PAIRS and not c["confirmed"], c
        assert "no configuration beat the baseline beyond noise" in c["verdict"]
    assert not r.confirmed


def test_a_real_gain_is_confirmed_with_its_interval(monkeypatch):
    fake = _Fake(lambda s: 2.0 if s.max_queue_delay_us == 500 else 1.0)
    fake.install(monkeypatch)
    r = _tune()
    assert r.best.setting.max_queue_delay_us == 500
    c = r.best.confirmation
    assert r.confirmed and c["confirmed"] and 1.7 < c["median_ratio"] < 2.3
    lo, hi = c["interval"]
    assert 1.05 < lo <= c["median_ratio"] <= hi
    assert [p["first"] for p in c["pairs"]] == ["baseline", "best", "baseline", "best", "baseline"]


def test_tune_reads_its_entry_once_and_the_confirmation_uploads_what_was_read(monkeypatch):
    fake = _Fake(lambda s: 2.0 if s.max_queue_delay_us == 500 else 1.0)
    fake.install(monkeypatch)
    reads, uploads = [], []
    files = {"file:1/model.mcpir": b"read once"}

    def read(cls, entry, version=None):
        reads.append(entry)
        return cls(entry, fake.config, 1, None, files)
    monkeypatch.setattr(T.Entry, "read", classmethod(read))
    load = T.load_model
    monkeypatch.setattr(T, "load_model", lambda s, config_json=None, files=None: (uploads.append(files),
                                                                                    load(s, config_json, files)))
    r = _tune()
    assert r.confirmed and reads == ["entry"]
    assert files in uploads   # the twin of the confirmation got the bytes tune read, not a second read
    assert r.config is not None and r.config.name == "m"   # apply writes over the config tune measured


def test_settings_the_same_on_this_machine_are_measured_once(monkeypatch):
    fake = _Fake(lambda s: 1.0)
    fake.install(monkeypatch)
    r = _tune(cores=1)   # one core: "1 thread" and "all threads" are one setting
    keys = [t.setting.normalized(1) for t in r.trials]
    assert len(keys) == len(set(keys)), keys
    assert any("not measured" in n for n in r.notes)


def test_bootstrap_interval_and_labels():
    lo, hi = T.bootstrap_median_interval([1.0, 1.1, 0.9, 1.05, 0.95])
    assert lo <= 1.0 <= hi and lo >= 0.9 and hi <= 1.1
    lo, hi = T.bootstrap_median_interval([2.0, 2.1, 1.9, 2.05, 1.95])
    assert lo > 1.5
    s = T.Setting(True, 16, (), 100, 2, 1)
    assert T.label(s) == "b16 d100us i2t1" and T.label(T.Setting(False, 0)) == "nb i1tall"
    assert T.Setting(True, 8, intra_op_threads=4).normalized(2).intra_op_threads == 0


def test_remote_request_from_a_config_without_batching():
    """A config without batching keeps the batch in its dims: axis 0 of a multi-dim input is sent
    at 1, the other -1 dims at 128 (a khmer tagger with a batch fixed at 1 inside failed every
    request at [128, 128]); a rank-1 input's -1 is a length; --dims sets any of them."""
    from tritonclient.grpc import model_config_pb2 as mc

    from mcp_compiler.targets.triton.bench import _remote_feeds

    cfg = mc.ModelConfig(name="tagger", max_batch_size=0)
    cfg.input.add(name="x", data_type=mc.TYPE_INT64, dims=[-1, -1])
    cfg.input.add(name="wave", data_type=mc.TYPE_FP32, dims=[-1])
    feeds, notes = _remote_feeds(cfg, None, 1, {}, 128)
    assert feeds["x"].shape == (1, 128) and feeds["wave"].shape == (128,)
    assert "x.0=1, x.1=128, wave.0=128" in notes[0]
    feeds, _ = _remote_feeds(cfg, None, 1, {"x.0": 4}, 128)
    assert feeds["x"].shape == (4, 128)


def test_the_timeout_trial_line_says_a_share_or_why_it_failed():
    setting = T.Setting(True, 8, inference_timeout_ms=20)
    p = _point(100.0)
    p.rejected, p.requests = 38, 250
    assert T._timeout_line(T.Trial(setting, p, None)) == \
        "timeout trial: inference_timeout_ms 20: 15.2% of requests rejected"
    assert T._timeout_line(T.Trial(setting, None, None, error="the server went away")) == \
        "timeout trial: inference_timeout_ms 20: failed: the server went away"


class _Client:
    """tritonclient's asyncio client as measure() uses it: infer() fails, or never returns."""

    def __init__(self, how: str) -> None:
        self.how, self.calls = how, 0

    async def infer(self, *a, **k):
        import asyncio

        self.calls += 1
        if self.how == "fail":
            await asyncio.sleep(0.001)
            raise RuntimeError("[StatusCode.INVALID_ARGUMENT] unexpected shape for input 'x'")
        await asyncio.sleep(3600)

    async def get_inference_statistics(self, *a, **k):
        return {"model_stats": []}


def test_a_point_whose_first_requests_all_fail_stops_early_and_says_why():
    import asyncio

    from mcp_compiler.targets.triton import loadgen

    c = _Client("fail")
    p = asyncio.run(loadgen.measure(c, "m", [], Load(concurrency=2), window_s=30, max_windows=3))
    # one window, cut short: not three 30 s windows of failures
    assert p.windows == 1 and p.requests == 0 and p.errors >= loadgen.EARLY_FAILURES
    assert any(n.startswith("stopped early: its first") and "unexpected shape" in n for n in p.notes), p.notes


def test_a_point_that_completed_nothing_says_what_is_in_flight():
    import asyncio

    from mcp_compiler.targets.triton import loadgen

    p = asyncio.run(loadgen.measure(_Client("hang"), "m", [], Load(concurrency=2), seconds=0.5))
    assert p.requests == 0 and p.errors == 0
    assert any("no request completed" in n and "2 in flight, the slowest sent" in n for n in p.notes), p.notes
