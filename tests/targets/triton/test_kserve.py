"""`deploy --kserve`: Kubernetes manifests for a repository entry, validated before they are written.

Golden files (golden_models/kserve/<model>/) hold the manifests of three real models;
`pytest tests/targets/triton/test_kserve.py --update-golden` rewrites them. No cluster runs here:
`--apply` is tested against a fake API server, said so in its name."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import threading

import pytest
import yaml
from _helpers import GOLDEN, zoo_model
from typer.testing import CliRunner

from mcp_compiler import CompileOptions, compile_model
from mcp_compiler.cli import app

# (find_spec, not importorskip: importing kserve next to tritonclient fails, see kserve.py)
if not all(importlib.util.find_spec(m) for m in ("kserve", "kubernetes", "kubernetes_validate")):
    if os.environ.get("CI"):
        raise RuntimeError("CI must run the KServe manifest tests: install '.[dev,serve,kube]'")
    pytest.skip("the kube extra is not installed (pip install -e '.[kube]')", allow_module_level=True)

runner = CliRunner()
MLP = GOLDEN / "mlp" / "model.onnx"
K8S = ["--storage-uri", "s3://models/repo", "--image", "registry.example/mcp-triton:24.10-ort"]


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    d = tmp_path_factory.mktemp("kserve")
    compile_model(MLP, d / "repo", CompileOptions.for_target("triton-v1.12", "mlp"))
    return d


def _kserve(entry, out, *extra):
    r = runner.invoke(app, ["deploy", str(entry), "--kserve", "-o", str(out), *K8S, *extra, "--json"])
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else {})


def _isvc(out):
    return yaml.safe_load((out / "inferenceservice.yaml").read_text())


@pytest.mark.parametrize("name", ["ppocr_cls", "eeg_seizure_lstm", "trueocr_rec"])
def test_manifests_of_real_models_match_golden(name, tmp_path, request):
    compile_model(zoo_model(name), tmp_path / "repo", CompileOptions.for_target("triton-v1.12", name))
    r, out = _kserve(tmp_path / "repo" / name, tmp_path / "m", "--min-replicas", "1", "--max-replicas", "4")
    assert r.exit_code == 0 and out["ok"], r.output
    golden = GOLDEN / "kserve" / name
    for rel in ("inferenceservice.yaml", "plain/triton.yaml", "Dockerfile"):
        # the entry's content hash changes with the runtime's code: checked in its own test, not kept
        got = re.sub(r"(mcp-cli/entry-sha256: )[0-9a-f]{64}", r"\1SHA256", (tmp_path / "m" / rel).read_text())
        got = re.sub(r"(/v\d+-)[0-9a-f]{12}\b", r"\1SHA12", got)   # the revision's folder: the same hash
        if rel == "Dockerfile":   # its pins are checked against the package index in their own test
            assert got.startswith("# ") and "FROM nvcr.io/nvidia/tritonserver:24.10-py3" in got
            continue
        if request.config.getoption("--update-golden"):
            (golden / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden / rel).write_text(got)
        assert got == (golden / rel).read_text(), f"{name}/{rel} changed (--update-golden rewrites it)"
    isvc = _isvc(tmp_path / "m")
    p = isvc["spec"]["predictor"]
    assert p["minReplicas"] == 1 and p["maxReplicas"] == 4
    assert p["model"]["modelFormat"] == {"name": "triton"}
    sha = p["annotations"]["mcp-cli/entry-sha256"]
    assert p["model"]["storageUri"] == f"s3://models/repo/v1-{sha[:12]}" == out["storage_uri"]
    assert p["model"]["readinessProbe"]["httpGet"]["path"] == f"/v2/models/{name}/ready"
    kinds = [d["kind"] for d in yaml.safe_load_all((tmp_path / "m" / "plain" / "triton.yaml").read_text())]
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler"]


def test_resources_follow_instances_threads_and_weights(entries, tmp_path):
    import re
    import shutil

    e = tmp_path / "mlp"
    shutil.copytree(entries / "repo" / "mlp", e)
    _, one = _kserve(e, tmp_path / "a")
    cfg = (e / "config.pbtxt").read_text()
    cfg = re.sub(r"count: \d+", "count: 3", cfg)
    cfg += 'parameters {\n  key: "intra_op_threads"\n  value {\n    string_value: "2"\n  }\n}\n'
    (e / "config.pbtxt").write_text(cfg)
    r, three = _kserve(e, tmp_path / "b")
    assert r.exit_code == 0, r.output
    res1, res3 = one["resources"]["resources"], three["resources"]["resources"]
    assert res1["requests"]["cpu"] == "1" and res3["requests"]["cpu"] == "6"   # 3 instances x 2 threads
    mib = lambda s: int(s.removesuffix("Mi"))  # noqa: E731
    assert mib(res3["requests"]["memory"]) > mib(res1["requests"]["memory"])
    assert mib(res3["limits"]["memory"]) == 2 * mib(res3["requests"]["memory"])
    assert "nvidia.com/gpu" not in res3["limits"]
    cfg = cfg.replace("KIND_CPU", "KIND_GPU")
    (e / "config.pbtxt").write_text(cfg)
    _, gpu = _kserve(e, tmp_path / "c")
    assert gpu["resources"]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def _tune_report(path, entry, load="concurrency 8", meets=True, model="mlp", matches=True, confirmed=False):
    """A report as `tune --json` writes it (its own classes): the baseline is the entry's config."""
    from mcp_compiler.targets.triton.entry import Entry
    from mcp_compiler.targets.triton.loadgen import Point
    from mcp_compiler.targets.triton.tune import Setting, Trial, TuneReport

    def trial(setting, tput, p50, p99, ok):
        pt = Point(load=load, concurrency=8, rate=None, batch_size=1, requests=1000, seconds=2.0, throughput=tput,
                   infer_per_s=tput, p50_ms=p50, p90_ms=p99, p99_ms=p99, mean_ms=p50, errors=0, rejected=0,
                   error_sample=None, queue_ms=1.0, compute_ms=2.0, avg_batch=1.0, client_cpu=0.2, windows=3,
                   stable=True)
        return Trial(setting, pt, 300.0, meets_slo=ok)

    served = Setting.of(Entry.read(entry).config)
    other = Setting(True, 16, (4,), 100, 3)
    base = trial(served if matches else Setting(False, 0), 900.0, 8.0, 12.0, meets)
    best = trial(other, 1400.0, 5.0, 9.0, True)
    if confirmed:
        best.confirmation = {"confirmed": True}
    rep = TuneReport(model, load, 20.0, "throughput", base, best, [base, best], None, 60.0, 50.0)
    path.write_text(json.dumps({"ok": True, **rep.to_dict()}))
    return path


def test_autoscaling_target_from_a_tune_report(entries, tmp_path):
    e = entries / "repo" / "mlp"
    r, out = _kserve(e, tmp_path / "m", "--from-tune", str(_tune_report(tmp_path / "t.json", e)))
    assert r.exit_code == 0, r.output
    p = _isvc(tmp_path / "m")["spec"]["predictor"]
    assert (p["scaleMetric"], p["scaleTarget"]) == ("concurrency", 8)   # the entry's config held 8 within 20 ms
    assert "(the report's baseline) held concurrency 8" in out["scaling"]["source"]
    assert not any("tune --apply" in n for n in out["notes"])
    # a confirmed better configuration the entry does not have yet: said so
    r, out = _kserve(e, tmp_path / "c", "--from-tune", str(_tune_report(tmp_path / "c.json", e, confirmed=True)))
    assert r.exit_code == 0 and any("`tune --apply` writes it" in n for n in out["notes"]), r.output
    # an open-loop rate: requests in flight = throughput x p50 (900/s x 8 ms = 7)
    r, _ = _kserve(e, tmp_path / "r", "--from-tune", str(_tune_report(tmp_path / "r.json", e, load="rate 900/s")))
    assert _isvc(tmp_path / "r")["spec"]["predictor"]["scaleTarget"] == 7
    for name, kw, text in (("n", {"meets": False}, "did not meet the p99 SLO"),
                           ("o", {"model": "other"}, "tuned 'other'"),
                           ("x", {"matches": False}, "neither its baseline nor its best")):
        r, out = _kserve(e, tmp_path / name, "--from-tune", str(_tune_report(tmp_path / f"{name}.json", e, **kw)))
        assert r.exit_code == 2 and text in out["error"]["message"], r.output
        assert not (tmp_path / name).exists()


def test_canary_and_promote_updates(entries, tmp_path):
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "c", "--canary-percent", "10")
    assert r.exit_code == 0, r.output
    assert _isvc(tmp_path / "c")["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert any("routes 10%" in n for n in out["notes"])
    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "p", "--promote")
    assert r.exit_code == 0 and _isvc(tmp_path / "p")["spec"]["predictor"]["canaryTrafficPercent"] == 100
    for bad in (["--canary-percent", "0"], ["--canary-percent", "100"], ["--canary-percent", "5", "--promote"]):
        r, out = _kserve(entries / "repo" / "mlp", tmp_path / "x", *bad)
        assert r.exit_code == 2 and not (tmp_path / "x").exists(), (bad, r.output)


@pytest.mark.parametrize("args, text", [
    (["--storage-uri", "/local/repo"], "--storage-uri"),
    (["--min-replicas", "5"], "--min-replicas"),
    (["--namespace", "Bad_NS"], "--namespace"),
    (["--service-name", "9lives"], "--service-name"),
    (["--url", "grpc://127.0.0.1:8001"], "give one"),
])
def test_bad_requests_are_one_line_and_write_nothing(entries, tmp_path, args, text):
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", *args)
    assert r.exit_code == 2 and text in out["error"]["message"], r.output
    assert not (tmp_path / "m").exists()


def test_a_python_backend_entry_needs_an_image_with_onnxruntime(entries, tmp_path):
    r = runner.invoke(app, ["deploy", str(entries / "repo" / "mlp"), "--kserve", "--storage-uri", "s3://b/r",
                            "-o", str(tmp_path / "m")])
    assert r.exit_code == 2 and "give --image" in r.output and not (tmp_path / "m").exists()
    r = runner.invoke(app, ["deploy", str(entries / "repo" / "mlp"), "--kserve", "--dockerfile"])
    assert r.exit_code == 0 and "FROM nvcr.io/nvidia/tritonserver:24.10-py3" in r.stdout
    assert "onnxruntime==1.23.2" in r.stdout and "numpy==1.26.4" in r.stdout and "(Python 3.10)" in r.stdout


def test_the_image_pins_are_installable_for_the_images_python(tmp_path):
    """Every pin of the Dockerfile, OpenVINO's for an OpenVINO entry included, has a wheel for the
    Python of the Triton image it names (asked of the package index, nothing downloaded: a dry
    run; skipped where no index answers)."""
    import subprocess
    import sys

    from mcp_compiler.targets.triton import kserve as ks

    py = ks.IMAGE_PYTHON[ks.TRITON_RUNTIME_VERSION]
    want = dict(ks.image_pins())
    if importlib.util.find_spec("openvino"):
        want = ks.image_pins("openvino")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                        "--only-binary=:all:", "-q", "--python-version", py, "--platform", "manylinux_2_28_x86_64",
                        "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                        "--target", str(tmp_path / "t"), "--report", str(tmp_path / "r.json"),
                        *[f"{k}=={v}" for k, v in want.items()]], capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and any(t in r.stderr for t in ("NewConnectionError", "Network is unreachable",
                                                         "Temporary failure in name resolution")):
        pytest.skip("no package index reachable")
    assert r.returncode == 0, r.stderr[-2000:]
    got = {i["metadata"]["name"].lower(): (i["metadata"]["version"], i["download_info"]["url"].rsplit("/", 1)[-1])
           for i in json.loads((tmp_path / "r.json").read_text())["install"]}
    assert {k: v for k, (v, _) in got.items()} == {k.lower(): v for k, v in want.items()}, got
    tag = "cp" + py.replace(".", "")
    assert all(f.endswith("py3-none-any.whl") or f"-{tag}-" in f for _, f in got.values()), got


def test_an_openvino_entry_s_image_carries_the_openvino_it_was_verified_with(tmp_path):
    pytest.importorskip("openvino", reason="openvino not installed (pip install -e '.[openvino]')")
    from importlib.metadata import version

    r = runner.invoke(app, ["convert", str(MLP), "-t", "triton-v1.12", "-o", str(tmp_path / "repo"),
                            "--runtime", "openvino", "--precision", "f32"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["deploy", str(tmp_path / "repo" / "model"), "--kserve", "--dockerfile"])
    assert r.exit_code == 0 and f"openvino=={version('openvino')}" in r.stdout, r.output
    r = runner.invoke(app, ["deploy", str(entries_mlp(tmp_path)), "--kserve", "--dockerfile"])
    assert r.exit_code == 0 and "openvino" not in r.stdout, r.output


def entries_mlp(tmp_path):
    compile_model(MLP, tmp_path / "plain", CompileOptions.for_target("triton-v1.12", "mlp"))
    return tmp_path / "plain" / "mlp"


def _fake_image_venv(tmp_path, scale: float):
    """A stand-in for the image's venv: this Python running the check's own runner, its outputs
    then scaled by `scale` (as another onnxruntime release computing the model otherwise would)."""
    import sys

    venv = tmp_path / "fake-venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(f"#!{sys.executable}\n"
                  "import sys\nimport numpy as np\n"
                  "code, args = sys.argv[2], sys.argv[3:]\nsys.argv = ['-c', *args]\n"
                  "exec(compile(code, '<runner>', 'exec'), {'__name__': '__main__'})\n"
                  "z = dict(np.load(args[3]))\n"
                  f"np.savez(args[3], **{{k: v * {scale!r} for k, v in z.items()}})\n")
    py.chmod(0o755)
    return venv


def test_check_image_runtime_writes_nothing_when_the_image_computes_the_entry_otherwise(entries, tmp_path,
                                                                                      monkeypatch):
    from mcp_compiler.targets.triton import image_runtime as ir

    monkeypatch.setattr(ir, "venv_for", lambda pins, say=None: _fake_image_venv(tmp_path, 1.01))
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--check-image-runtime")
    message = out["error"]["message"]
    assert r.exit_code == 1 and out["error"]["type"] == "VerificationError", r.output
    assert "outside cos=0.99999, rel=0.001" in message and "relative error 0.01" in message, message
    assert not (tmp_path / "m").exists()
    r = runner.invoke(app, ["deploy", str(entries / "repo" / "mlp"), "--kserve", "--dockerfile",
                            "--check-image-runtime"])
    assert r.exit_code == 1 and "FROM" not in r.stdout, r.output
    # the same outputs: within, said in the notes and the report
    monkeypatch.setattr(ir, "venv_for", lambda pins, say=None: _fake_image_venv(tmp_path / "same", 1.0))
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--check-image-runtime")
    assert r.exit_code == 0 and out["image_check"]["ok"] and out["image_check"]["samples"] == ir.SAMPLES, r.output
    assert out["image_check"]["accuracy"]["max_abs"] == 0 and out["notes"][0].startswith("checked: ")
    r = runner.invoke(app, ["deploy", str(entries / "repo" / "mlp"), "--check-image-runtime", "--url",
                            "grpc://127.0.0.1:1"])
    assert r.exit_code == 2 and "--check-image-runtime goes with --kserve" in r.output, r.output


def test_without_the_check_a_note_says_the_image_runs_another_onnxruntime(entries, tmp_path):
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m")
    assert r.exit_code == 0 and out["image_check"] is None
    assert any("the image runs onnxruntime 1.23.2" in n and "--check-image-runtime" in n for n in out["notes"])


@pytest.mark.slow
def test_check_image_runtime_installs_the_images_onnxruntime_and_runs_the_entry_in_it(entries, tmp_path,
                                                                                     monkeypatch):
    """The real thing: the image's pins installed in a venv of this Python (once, in the cache),
    the entry's bundled runtime run there and here; skipped where no package index answers."""
    from mcp_compiler.targets.triton import image_runtime as ir
    from mcp_compiler.targets.triton import kserve as ks

    try:
        venv = ir.venv_for(ks.image_pins())
    except Exception as e:
        if any(t in str(e) for t in ("NewConnectionError", "Network is unreachable", "name resolution",
                                     "No matching distribution")):
            pytest.skip(f"no package index reachable: {e}")
        raise
    assert (venv / "complete").is_file()
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--check-image-runtime")
    assert r.exit_code == 0, r.output
    c = out["image_check"]
    assert c["ok"] and c["image_versions"]["onnxruntime"] == ks.image_pins()["onnxruntime"]
    import onnxruntime

    assert c["verified_versions"]["onnxruntime"] == onnxruntime.__version__
    assert "installing" not in r.stderr   # made once: the cached one is used


def test_an_entry_newer_than_the_images_onnxruntime_is_refused(entries, monkeypatch):
    from mcp_compiler.targets.triton import kserve as ks

    monkeypatch.setitem(ks.ORT_MAX_OPSET, ks.image_pins()["onnxruntime"], 5)
    r = runner.invoke(app, ["deploy", str(entries / "repo" / "mlp"), "--kserve", "--dockerfile"])
    assert r.exit_code == 2 and "runs opset 5 at most" in r.output, r.output


def test_a_changed_entry_is_a_new_revision_and_the_same_entry_the_same_manifest(entries, tmp_path):
    """A canary of other model files differs from the stable manifest in its predictor (Knative makes
    a revision) and in the plain Deployment's pod template (it rolls), not only in the traffic split."""
    import shutil

    e = entries / "repo" / "mlp"
    changed = tmp_path / "repo" / "mlp"
    shutil.copytree(e, changed)
    shutil.copytree(changed / "1", changed / "2")
    (changed / "2" / "model.mcpir").write_bytes((changed / "2" / "model.mcpir").read_bytes() + b"\0")
    for out, entry, extra in (("a", e, []), ("b", e, []), ("c", changed, ["--canary-percent", "10"])):
        r, _ = _kserve(entry, tmp_path / out, *extra)
        assert r.exit_code == 0, r.output
    a, b, c = (_isvc(tmp_path / x)["spec"]["predictor"] for x in "abc")
    assert a == b
    assert c["annotations"]["mcp-cli/entry-sha256"] != a["annotations"]["mcp-cli/entry-sha256"]
    assert c["annotations"]["mcp-cli/model-version"] == "2" and a["annotations"]["mcp-cli/model-version"] == "1"
    plain = [next(yaml.safe_load_all((tmp_path / x / "plain" / "triton.yaml").read_text())) for x in "ac"]
    assert plain[0]["spec"]["template"]["metadata"]["annotations"] != plain[1]["spec"]["template"]["metadata"]["annotations"]


def test_kserve_essentials_protocol_mode_account_and_shared_memory(entries, tmp_path):
    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--service-account", "models-sa")
    assert r.exit_code == 0, r.output
    isvc = _isvc(tmp_path / "m")
    p = isvc["spec"]["predictor"]
    assert p["model"]["protocolVersion"] == "v2"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Serverless"
    assert p["serviceAccountName"] == "models-sa"
    assert p["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "192Mi"}}]
    assert p["model"]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert p["model"]["readinessProbe"]["httpGet"]["port"] == 8080   # KServe's Triton runtime's HTTP port
    deployment = next(yaml.safe_load_all((tmp_path / "m" / "plain" / "triton.yaml").read_text()))
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "models-sa" and {"name": "dshm", "mountPath": "/dev/shm"} in \
        pod["containers"][0]["volumeMounts"]
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "x", "--service-account", "Bad_Account")
    assert r.exit_code == 2 and "--service-account" in out["error"]["message"] and not (tmp_path / "x").exists()


def test_a_manifest_that_does_not_validate_is_never_written(entries, tmp_path, monkeypatch):
    from mcp_compiler.targets.triton import kserve as ks

    real = ks._plain

    def broken(*a, **kw):
        docs = real(*a, **kw)
        docs[0]["spec"]["replicas"] = "three"   # a string where Kubernetes wants an integer
        return docs

    monkeypatch.setattr(ks, "_plain", broken)
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m")
    assert r.exit_code == 1 and "does not validate against Kubernetes" in out["error"]["message"], r.output
    assert "replicas" in out["error"]["message"] and not (tmp_path / "m").exists()


def test_the_kserve_check_names_unknown_fields_and_wrong_types(entries, tmp_path):
    from mcp_compiler.targets.triton.kserve_validate import ManifestError, validate_kserve

    _kserve(entries / "repo" / "mlp", tmp_path / "m")
    good = _isvc(tmp_path / "m")
    validate_kserve(good, "ok")
    for path, value, text in ((("spec", "predictor", "model", "storageUrl"), "s3://x", "storageUrl"),
                              (("spec", "predictor", "minReplicas"), "one", "expected int"),
                              (("spec", "predictor", "model", "resources", "limitz"), {}, "limitz"),
                              (("metadata", "labelz"), {}, "labelz")):
        doc = json.loads(json.dumps(good))
        d = doc
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
        with pytest.raises(ManifestError, match=text):
            validate_kserve(doc, "bad")


class _FakeApiServer(http.server.BaseHTTPRequestHandler):
    """Just enough of a Kubernetes API server for create-or-replace: objects by path."""

    objects: dict = {}
    log: list = []

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.log.append(("GET", self.path))
        if self.path in self.objects:
            return self._send(200, self.objects[self.path])
        self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                         "code": 404, "message": "not found"})

    def _body(self):
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def do_POST(self):
        body = self._body()
        self.log.append(("POST", self.path))
        body.setdefault("metadata", {})["resourceVersion"] = "1"
        self.objects[f"{self.path}/{body['metadata']['name']}"] = body
        self._send(201, body)

    def do_PUT(self):
        body = self._body()
        self.log.append(("PUT", self.path, body["metadata"].get("resourceVersion")))
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        self.objects[self.path] = body
        self._send(200, body)

    def log_message(self, *a):
        pass


def test_apply_against_a_fake_api_server_as_no_cluster_runs_here(entries, tmp_path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{srv.server_port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": "ml"}}]}))
    try:
        e = entries / "repo" / "mlp"
        r, out = _kserve(e, tmp_path / "m", "--namespace", "ml", "--apply", "--kubeconfig", str(kubeconfig))
        assert r.exit_code == 0, r.output
        assert out["applied"] == ["InferenceService ml/mlp: created"]
        isvc = "/apis/serving.kserve.io/v1beta1/namespaces/ml/inferenceservices"
        assert ("POST", isvc) in _FakeApiServer.log
        # the canary update replaces it, carrying the resourceVersion it read
        # (--force: the manifests of the first write are replaced)
        r, out = _kserve(e, tmp_path / "m", "--namespace", "ml", "--apply", "--kubeconfig", str(kubeconfig),
                         "--canary-percent", "20", "--force")
        assert out["applied"] == ["InferenceService ml/mlp: updated"], r.output
        assert ("PUT", f"{isvc}/mlp", "1") in _FakeApiServer.log
        assert _FakeApiServer.objects[f"{isvc}/mlp"]["spec"]["predictor"]["canaryTrafficPercent"] == 20
        # the plain kinds through their own APIs
        r, out = _kserve(e, tmp_path / "m", "--namespace", "ml", "--apply", "--plain", "--kubeconfig", str(kubeconfig),
                         "--force")
        assert r.exit_code == 0, r.output
        assert out["applied"] == ["Deployment ml/mlp: created", "Service ml/mlp: created",
                                  "HorizontalPodAutoscaler ml/mlp: created"]
    finally:
        srv.shutdown()
        srv.server_close()
    # no API server there: one line, exit 1
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--apply", "--kubeconfig", str(kubeconfig), "--force")
    assert r.exit_code == 1 and "cannot reach the API server" in out["error"]["message"], r.output


@pytest.mark.parametrize("args, text", [
    (["--storage-uri", "pvc://claim/../.."], "'..'"),
    (["--storage-uri", "s3://"], "a bucket or claim"),
    (["--image", ""], "--image"),
    (["--max-replicas", "3000000000"], "int32"),
    (["--min-replicas", "2147483648", "--max-replicas", "2147483649"], "int32"),
])
def test_hostile_kserve_values_are_one_line_and_write_nothing(entries, tmp_path, args, text):
    # (the later flag wins where K8S gives it too)
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", *args)
    assert r.exit_code == 2 and text in out["error"]["message"], r.output
    assert not (tmp_path / "m").exists()


def test_existing_manifests_are_kept_without_force_and_empty_output_is_refused(entries, tmp_path, monkeypatch):
    out = tmp_path / "m"
    r, _ = _kserve(entries / "repo" / "mlp", out)
    assert r.exit_code == 0, r.output
    (out / "inferenceservice.yaml").write_text("# mine\n")
    r, got = _kserve(entries / "repo" / "mlp", out)
    assert r.exit_code == 2 and "--force" in got["error"]["message"]
    assert (out / "inferenceservice.yaml").read_text() == "# mine\n"
    r, _ = _kserve(entries / "repo" / "mlp", out, "--force")
    assert r.exit_code == 0 and "InferenceService" in (out / "inferenceservice.yaml").read_text()
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["deploy", str(entries / "repo" / "mlp"), "--kserve", "-o", "", *K8S, "--json"])
    assert r.exit_code == 2 and "empty name" in r.stdout and not (tmp_path / "inferenceservice.yaml").exists()


@pytest.mark.parametrize("report", [
    "[]", '{"load": "concurrency 8", "slo_p99_ms": "nan", "baseline": {}}',
    '{"load": "concurrency 99999999999", "slo_p99_ms": 5, "baseline": {"config": {}}}',
    '{"load": "concurrency 8", "slo_p99_ms": 5, "baseline": 3}', "\\xff",
])
def test_a_malformed_tune_report_is_one_clean_error(entries, tmp_path, report):
    p = tmp_path / "tune.json"
    p.write_bytes(report.encode("latin-1") if report == "\\xff" else report.encode())
    if report == "\\xff":
        p.write_bytes(b"\xff\xfe{")
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--from-tune", str(p))
    assert r.exit_code == 2 and "--from-tune" in out["error"]["message"], r.output
    assert "internal error" not in r.output


def test_a_kubeconfig_that_is_a_fifo_is_refused_at_once(entries, tmp_path):
    fifo = tmp_path / "kubeconfig"
    os.mkfifo(fifo)
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--apply", "--kubeconfig", str(fifo))
    assert r.exit_code == 2 and "not a regular file" in out["error"]["message"], r.output


@pytest.mark.parametrize("tamper, text", [
    ('parameters {\n  key: "intra_op_threads"\n  value {\n    string_value: "abc"\n  }\n}\n', "intra_op_threads"),
    ('parameters {\n  key: "intra_op_threads"\n  value {\n    string_value: "100000000000000000000"\n  }\n}\n',
     "intra_op_threads"),
])
def test_a_tampered_entry_gives_no_manifest(entries, tmp_path, tamper, text):
    import shutil

    bad = tmp_path / "r" / "mlp"
    shutil.copytree(entries / "repo" / "mlp", bad)
    (bad / "config.pbtxt").write_text((bad / "config.pbtxt").read_text() + tamper)
    r, out = _kserve(bad, tmp_path / "m")
    assert r.exit_code == 2 and text in out["error"]["message"], r.output
    assert not (tmp_path / "m").exists()


def test_instances_beyond_a_pod_give_no_manifest(entries, tmp_path):
    import re
    import shutil

    bad = tmp_path / "r" / "mlp"
    shutil.copytree(entries / "repo" / "mlp", bad)
    cfg = bad / "config.pbtxt"
    cfg.write_text(re.sub(r"count: \d+", "count: 2147483647", cfg.read_text()))
    r, out = _kserve(bad, tmp_path / "m")
    assert r.exit_code == 2 and "instances" in out["error"]["message"], r.output


def test_a_latency_checked_canary_is_an_argo_rollout_with_its_analysis(entries, tmp_path):
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--canary-steps", "10,30,100", "--max-p99-ms", "50")
    assert r.exit_code == 0, r.output
    rollout, analysis = yaml.safe_load_all((tmp_path / "m" / "rollout" / "rollout.yaml").read_text())
    assert rollout["apiVersion"] == "argoproj.io/v1alpha1" and rollout["kind"] == "Rollout"
    steps = rollout["spec"]["strategy"]["canary"]["steps"]
    assert steps == [{"setWeight": 10}, {"pause": {"duration": "5m"}}, {"setWeight": 30},
                     {"pause": {"duration": "5m"}}, {"setWeight": 100}]
    assert rollout["spec"]["strategy"]["canary"]["analysis"]["templates"] == [{"templateName": "mlp-p99"}]
    container = rollout["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-config=summary_latencies=true" in container["args"]   # what the query reads
    # issue 61: 1 replica made setWeight 10 about 100% (Argo rounds to whole pods); 10 make 10% and 30% exact
    assert rollout["spec"]["replicas"] == 10
    m = analysis["spec"]["metrics"][0]
    assert analysis["kind"] == "AnalysisTemplate" and analysis["metadata"]["name"] == "mlp-p99"
    # no data (too few canary requests) passes neither condition: inconclusive, the rollout pauses
    assert m["successCondition"] == "len(result) > 0 && result[0] <= 50"
    assert m["failureCondition"] == "len(result) > 0 && result[0] > 50" and m["failureLimit"] == 1 and "count" not in m
    assert any(n.startswith("rollout:") for n in out["notes"])
    for bad, text in ((["--canary-steps", "10,30"], "end at 100"), (["--canary-steps", "30,10,100"], "rising"),
                      (["--canary-steps", "10,100"], "needs --max-p99-ms"), (["--max-p99-ms", "5"], "goes with"),
                      (["--canary-steps", "10,x,100", "--max-p99-ms", "5"], "whole percentages"),
                      (["--canary-steps", "10,100", "--max-p99-ms", "5", "--step-pause", "5 m"], "--step-pause"),
                      (["--canary-steps", "10,100", "--max-p99-ms", "5", "--prometheus-url", "file:///etc/passwd"],
                       "--prometheus-url")):
        r, out = _kserve(entries / "repo" / "mlp", tmp_path / "x", *bad)
        assert r.exit_code == 2 and text in out["error"]["message"], (bad, r.output)
        assert not (tmp_path / "x").exists()


def test_the_argo_check_holds_the_fields_its_documentation_requires(monkeypatch):
    from mcp_compiler.targets.triton import kserve as ks
    from mcp_compiler.targets.triton import kserve_validate as kv_

    kv = kv_.lib("kubernetes_validate")
    good = {"apiVersion": ks.ARGO_API, "kind": "AnalysisTemplate", "metadata": {"name": "a"},
            "spec": {"metrics": [{"name": "p", "successCondition": "result[0] < 1",
                                  "provider": {"prometheus": {"address": "http://p:9090", "query": "up"}}}]}}
    kv_.validate_argo(good, "x", kv)
    bad = {**good, "spec": {"metrics": [{"name": "p", "provider": {"prometheus": {"address": "http://p:9090"}}}]}}
    with pytest.raises(ks.ManifestError, match="successCondition"):
        kv_.validate_argo(bad, "x", kv)
    rollout = {"apiVersion": ks.ARGO_API, "kind": "Rollout", "metadata": {"name": "r"},
               "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
                        "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}]}},
                        "strategy": {"canary": {"steps": [{"setWeight": 100}]}}}}
    with pytest.raises(ks.ManifestError, match="pod template"):
        kv_.validate_argo(rollout, "x", kv)
    rollout["spec"]["template"]["spec"]["containers"][0].pop("bogus")
    kv_.validate_argo(rollout, "x", kv)
    rollout["spec"]["strategy"]["canary"]["steps"] = [{"setWeight": 101}]
    with pytest.raises(ks.ManifestError, match="setWeight"):
        kv_.validate_argo(rollout, "x", kv)


@pytest.mark.parametrize("case", ["deep", "throughput 1e308", "p50 1e308", "p99 nan", "NaN constant", "huge int"])
def test_a_hostile_tune_report_is_one_clean_error(entries, tmp_path, case):
    """Issue 62 round 5: 100,000 nested levels and a throughput of 1e308 (x p50 overflows the
    in-flight target) were internal errors; NaN/Infinity constants and 5,000-digit integers too."""
    e = entries / "repo" / "mlp"
    p = _tune_report(tmp_path / "t.json", e, load="rate 900/s")
    rep = json.loads(p.read_text())
    if case == "deep":
        p.write_text("[" * 100_000 + "]" * 100_000)
    elif case in ("throughput 1e308", "p50 1e308", "p99 nan"):
        key, value = case.split()
        rep["baseline"][{"throughput": "throughput", "p50": "p50_ms", "p99": "p99_ms"}[key]] = float(value)
        p.write_text(json.dumps(rep))   # (json writes nan as NaN)
    elif case == "NaN constant":
        p.write_text(json.dumps(rep).replace('"slo_p99_ms": 20.0', '"slo_p99_ms": NaN'))
    else:
        p.write_text(json.dumps(rep).replace('"slo_p99_ms": 20.0', '"slo_p99_ms": ' + "9" * 5000))
    r, out = _kserve(e, tmp_path / "m", "--from-tune", str(p))
    assert r.exit_code == 2 and "--from-tune" in out["error"]["message"], r.output
    assert "internal error" not in r.output and not (tmp_path / "m").exists()


ROLL = ["--canary-steps", "10,30,100", "--max-p99-ms", "50"]


@pytest.mark.parametrize("extra, expect", [
    (["--canary-steps", "10,30,100", "--max-p99-ms", "1e-300"], "between 0.1 ms and 1e6 ms"),
    ([*ROLL, "--step-pause", "99999h"], "at most 24h"),
    ([*ROLL, "--canary-percent", "10"], "two ways to roll out"),
    ([*ROLL, "--prometheus-url", "http://prom:9090/{{args.x}}"], "braces"),
    ([*ROLL, "--prometheus-url", "http://" + "p" * 100_000], "more than a URL here may be"),
    (["--service-name", ""], "--service-name: empty"),
    (["--model-version", "100000000000000000000"], "--model-version"),
])
def test_round5_low_kserve_flags_are_refused(entries, tmp_path, extra, expect):
    """Issue 62 round 5, low items: each was accepted (or ignored) before."""
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", *extra)
    message = out["error"]["message"] if out else r.output
    assert r.exit_code == 2 and expect in message, r.output
    assert not (tmp_path / "m").exists()


def test_the_prometheus_url_is_written_as_checked(entries, tmp_path):
    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "m", *ROLL, "--prometheus-url", " http://prom:9090\n")
    assert r.exit_code == 0, r.output
    text = (tmp_path / "m" / "rollout" / "analysistemplate.yaml").read_text() if (
        tmp_path / "m" / "rollout" / "analysistemplate.yaml").exists() else "".join(
        p.read_text() for p in (tmp_path / "m").rglob("*.yaml"))
    assert "address: http://prom:9090\n" in text and "http://prom:9090\\n" not in text


def test_an_error_naming_a_value_with_a_newline_is_one_line(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "mcp_compiler.cli", "convert", str(tmp_path / "no\nsuch.onnx"),
                        "-t", "triton-v1.12", "-o", str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "no\\nsuch.onnx" in lines[0], r.stderr


def test_a_garbage_kubeconfig_is_one_readable_line(entries, tmp_path):
    """Issue 62 round 5 (partly fixed from round 4): a YAML error's own newlines made it 2 lines."""
    kc = tmp_path / "kubeconfig"
    kc.write_text("garbage: [\n  x: }\n")
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--apply", "--kubeconfig", str(kc))
    message = out["error"]["message"]
    assert r.exit_code == 2 and "no usable kubeconfig" in message and "\n" not in message and "\\n" not in message


def test_service_and_container_ports_name_their_protocol(entries, tmp_path):
    """Issue 61: the plain Service's ports had no `protocol`; server-side apply keys ports by
    (port, protocol), and an API server (v1.20, server-side dry run) refused the apply."""
    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "m")
    assert r.exit_code == 0, r.output
    docs = {d["kind"]: d for d in yaml.safe_load_all((tmp_path / "m" / "plain" / "triton.yaml").read_text())}
    ports = docs["Service"]["spec"]["ports"]
    assert ports and all(p["protocol"] == "TCP" for p in ports)
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert all(p["protocol"] == "TCP" for p in container["ports"])


@pytest.mark.parametrize("version, ok", [("1.25", True), ("v1.28.3", True), ("1.37", True), ("1.20", False),
                                         ("1.24", False), ("2.0", False), ("1.x", False), ("1.99", False)])
def test_the_kube_version_is_stated_and_checked(entries, tmp_path, version, ok):
    """--kube-version: the manifests are validated against that release's schemas; older than the
    oldest validated (1.25), or one with no schemas here, is refused before anything is written."""
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--kube-version", version)
    if ok:
        assert r.exit_code == 0 and out["ok"], r.output
        return
    message = out["error"]["message"] if out else r.output
    assert r.exit_code == 2 and "--kube-version" in message and len(message.splitlines()) == 1, r.output
    assert not (tmp_path / "m").exists()
    if version in ("1.20", "1.24"):
        assert "1.25 or newer" in message


def test_the_manifests_are_validated_against_the_kube_version_given(entries, tmp_path, monkeypatch):
    from mcp_compiler.targets.triton import kserve_validate as kv

    seen = []
    real = kv.validate

    def spy(files, version=kv.KUBERNETES_VERSION):
        seen.append(version)
        return real(files, version)
    monkeypatch.setattr("mcp_compiler.targets.triton.kserve.validate", spy)
    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--kube-version", "v1.27.4")
    assert r.exit_code == 0 and seen == ["1.27.0"], (r.output, seen)


def test_kube_version_goes_with_kserve(entries):
    r = runner.invoke(app, ["deploy", str(entries / "repo" / "mlp"), "--url", "http://127.0.0.1:1", "--kube-version", "1.28"])
    assert r.exit_code == 2 and "--kube-version goes with --kserve" in r.output, r.output


def test_the_rollouts_analysis_sees_only_the_canary_pods(entries, tmp_path):
    """Issue 61: the p99 query covered the stable pods too, so a bad canary was averaged away. The
    Rollout hands the canary's pod-template hash to the template, whose query selects by it, and
    counts the canary's requests (too few: no result)."""
    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "m", *ROLL, "--analysis-min-requests", "200",
                   "--analysis-failure-limit", "2", "--analysis-count", "30")
    assert r.exit_code == 0, r.output
    rollout, analysis = yaml.safe_load_all((tmp_path / "m" / "rollout" / "rollout.yaml").read_text())
    args = rollout["spec"]["strategy"]["canary"]["analysis"]["args"]
    assert args == [{"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]
    assert analysis["spec"]["args"] == [{"name": "canary-hash"}]
    m = analysis["spec"]["metrics"][0]
    q = m["provider"]["prometheus"]["query"]
    canary = 'rollouts_pod_template_hash="{{args.canary-hash}}"'
    # every selector of the query names the canary's hash: a series of a stable pod matches none
    selectors = re.findall(r"\{([^{}]*(?:\{\{[^}]*\}\}[^{}]*)*)\}", q)
    assert selectors and all(canary in sel for sel in selectors), q
    assert "nv_inference_request_summary_us" in q and ">= 200" in q and "nv_inference_request_success" in q
    assert m["failureLimit"] == 2 and m["count"] == 30


@pytest.mark.parametrize("steps, pods", [("10,30,100", 10), ("25,50,100", 4), ("50,100", 2), ("20,100", 5),
                                         ("100", 1)])
def test_the_rollouts_replicas_make_each_weight_whole_pods(entries, tmp_path, steps, pods):
    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "m", "--canary-steps", steps, "--max-p99-ms", "50")
    assert r.exit_code == 0, r.output
    rollout = next(yaml.safe_load_all((tmp_path / "m" / "rollout" / "rollout.yaml").read_text()))
    n = rollout["spec"]["replicas"]
    assert n == pods and all(w * n % 100 == 0 for w in map(int, steps.split(",")))


@pytest.mark.parametrize("extra, text", [(["--canary-steps", "1,100"], "need 100 replicas"),
                                         (["--canary-steps", "3,100"], "need 100 replicas"),
                                         ([*ROLL, "--analysis-min-requests", "0"], "--analysis-min-requests 0"),
                                         ([*ROLL, "--analysis-count", "0"], "--analysis-count 0"),
                                         (["--analysis-count", "3"], "go with --canary-steps")])
def test_rollout_weights_no_pods_reach_and_bad_analysis_flags_are_refused(entries, tmp_path, extra, text):
    r, out = _kserve(entries / "repo" / "mlp", tmp_path / "m", *extra, *(["--max-p99-ms", "50"] if
                                                                         extra[0] == "--canary-steps" else []))
    message = out["error"]["message"] if out else r.output
    assert r.exit_code == 2 and text in message, r.output
    assert not (tmp_path / "m").exists()


def test_a_stable_pod_never_reads_the_canarys_storage(entries, tmp_path):
    """Issue 61: both revisions read the same storage path, so a stable pod that restarted during
    a canary loaded the new model. Each revision now reads its own folder (the model version and
    the entry's content hash), the InferenceService's and the plain Deployment's alike; a
    `{version}` field in --storage-uri says where it goes."""
    import shutil

    v1 = entries / "repo" / "mlp"
    changed = tmp_path / "repo2" / "mlp"
    shutil.copytree(v1, changed)
    cfg = changed / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
    uris = {}
    for tag, entry, extra in (("stable", v1, []), ("canary", changed, ["--canary-percent", "10"])):
        r, out = _kserve(entry, tmp_path / tag, *extra)
        assert r.exit_code == 0, r.output
        isvc = _isvc(tmp_path / tag)["spec"]["predictor"]
        dep = next(yaml.safe_load_all((tmp_path / tag / "plain" / "triton.yaml").read_text()))
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        uris[tag] = isvc["model"]["storageUri"]
        assert f"--model-repository={uris[tag]}" in args and out["storage_uri"] == uris[tag]
        assert any(f"upload the repository (the folder holding mlp/) to {uris[tag]}" in n for n in out["notes"])
    stable, canary = uris["stable"], uris["canary"]
    # neither folder holds the other: what a stable pod resolves never reaches the canary's files
    assert stable != canary and not canary.startswith(stable + "/") and not stable.startswith(canary + "/")
    r, out = _kserve(v1, tmp_path / "f", "--storage-uri", "gs://b/{version}/repository")
    assert r.exit_code == 0 and re.fullmatch(r"gs://b/v1-[0-9a-f]{12}/repository", _isvc(tmp_path / "f")["spec"][
        "predictor"]["model"]["storageUri"]), r.output
    r, out = _kserve(v1, tmp_path / "g", "--storage-uri", "s3://b/{sha}/r")
    assert r.exit_code == 2 and "braces only as {version}" in out["error"]["message"], r.output


@pytest.mark.parametrize("extra", [
    [],
    ["--canary-steps", "25,50,100", "--analysis-count", "3", "--analysis-failure-limit", "0",
     "--analysis-min-requests", "10", "--step-pause", "30s", "--prometheus-url", "http://prometheus.monitoring:9090"],
])
def test_the_rollout_and_its_analysis_pass_argo_rollouts_own_schemas(entries, tmp_path, extra):
    """issue 61: the Rollout and AnalysisTemplate against the schemas Argo Rollouts' Go types
    generate (npm @kubernetes-models/argo-rollouts, pinned in tests/argo_schemas): its validators
    pass, and no field of ours is one its types do not declare."""
    import _argo_schema as argo

    args = extra or [*ROLL]
    if "--max-p99-ms" not in args:
        args = [*args, "--max-p99-ms", "50"]
    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "m", *args)
    assert r.exit_code == 0, r.output
    docs = list(yaml.safe_load_all((tmp_path / "m" / "rollout" / "rollout.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Rollout", "AnalysisTemplate"]
    assert argo.validate(docs) == [None, None]
    assert [argo.unknown_fields(d) for d in docs] == [[], []]


def test_argo_rollouts_schemas_catch_a_misspelt_field_and_a_wrong_type(entries, tmp_path):
    """The schema check itself can fail: a misspelt field (which a server without the CRD's
    structural schema would drop silently) and a weight that is not a number."""
    import copy

    import _argo_schema as argo

    r, _ = _kserve(entries / "repo" / "mlp", tmp_path / "m", *ROLL)
    assert r.exit_code == 0, r.output
    rollout, analysis = yaml.safe_load_all((tmp_path / "m" / "rollout" / "rollout.yaml").read_text())
    misspelt = copy.deepcopy(rollout)
    misspelt["spec"]["strategy"]["canary"]["stepz"] = misspelt["spec"]["strategy"]["canary"].pop("steps")
    typo = copy.deepcopy(analysis)
    typo["spec"]["metrics"][0]["provider"]["prometheus"]["adress"] = "http://p:9090"
    assert argo.unknown_fields(misspelt) == ["spec.strategy.canary.stepz"]
    assert argo.unknown_fields(typo) == ["spec.metrics[0].provider.prometheus.adress"]
    wrong = copy.deepcopy(rollout)
    wrong["spec"]["strategy"]["canary"]["steps"][0]["setWeight"] = "ten"
    got = argo.validate([wrong, analysis])
    assert got[0] and "setWeight must be integer" in got[0] and got[1] is None


def test_the_dockerfile_builds_where_docker_is_present(entries, tmp_path):
    """issue 61: the Dockerfile `--dockerfile` prints builds, and its image's onnxruntime is the pin;
    skipped with the reason where docker, its daemon or the base image's registry is not there."""
    import shutil
    import subprocess

    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed here: the Dockerfile is not built")
    if subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip("no docker daemon answers here: the Dockerfile is not built")
    from mcp_compiler.targets.triton import kserve as ks

    r = runner.invoke(app, ["deploy", str(entries / "repo" / "mlp"), "--kserve", "--dockerfile"])
    assert r.exit_code == 0, r.output
    (tmp_path / "Dockerfile").write_text(r.stdout)
    tag = "mcp-cli-test-image:latest"
    b = subprocess.run([docker, "build", "-t", tag, str(tmp_path)], capture_output=True, text=True, timeout=3600)
    if b.returncode != 0 and any(t in b.stderr for t in ("failed to resolve source metadata", "pull access denied",
                                                         "no such host", "dial tcp", "TLS handshake timeout")):
        pytest.skip(f"the base image {ks.TRITON_IMAGE} cannot be pulled here")
    assert b.returncode == 0, b.stderr[-3000:]
    v = subprocess.run([docker, "run", "--rm", tag, "python3", "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                       capture_output=True, text=True, timeout=600)
    assert v.stdout.strip() == ks.image_pins()["onnxruntime"], v.stderr[-2000:]
