"""Kubernetes manifests for a repository entry: a KServe InferenceService with a Triton predictor,
and a plain Deployment + Service + HorizontalPodAutoscaler for clusters without KServe.

What a user would otherwise work out by hand comes from the entry and, when given, from a `tune`
report: CPU and memory from the weights, the instance count and the threads; a GPU when the
config's instances are GPU ones; the autoscaling target from the concurrency the tuned
configuration held within its SLO. Every manifest is validated before any is written (core
kinds against the Kubernetes schemas with kubernetes-validate, the InferenceService through the
KServe SDK's model types); one that does not validate is never written. `--apply` sends them
through the Kubernetes API (the `kubernetes` client) when a kubeconfig is present.

The libraries are the `kube` extra (`pip install 'mcp-cli[kube]'`); without them, one line says so.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_compiler.errors import InvalidModelError, McpError, UsageError

from .entry import execution_of, int_parameter
from .kserve_validate import ARGO_API, KUBERNETES_VERSION, KubeLibraryError, ManifestError, kube_version, lib, validate  # noqa: F401 - re-exported
from .runtime import params as P

# The Triton release the local `mcp-cli serve` runs (tritonserver 2.51 from nvidia-pytriton 0.7.0)
# is NGC's 24.10 image: manifests ask for the same, so what was verified here is what runs there.
TRITON_RUNTIME_VERSION = "24.10-py3"
TRITON_IMAGE = f"nvcr.io/nvidia/tritonserver:{TRITON_RUNTIME_VERSION}"
# The Python of each Triton image the manifests ask for (NGC's 24.10 is Ubuntu 22.04 with Python
# 3.10), and the python runtime's pins that have a wheel for it: onnxruntime 1.23.2 is the newest
# release with cp310 wheels (no later one for 3.10 on PyPI), numpy<2 for Triton's python backend,
# flatbuffers at the release the .mcpir reader was generated for (pure Python). A test asks the
# package index for each pin at the image's Python (tests/targets/triton/test_kserve.py).
IMAGE_PYTHON = {"24.10-py3": "3.10"}
RUNTIME_PINS = {"3.10": {"onnxruntime": "1.23.2", "numpy": "1.26.4", "flatbuffers": "25.12.19"}}
ORT_MAX_OPSET = {"1.23.2": 23}   # measured 2026-12-05: a one-node model of each opset in a session
STORAGE_SCHEMES = ("s3://", "gs://", "pvc://", "https://", "hdfs://", "webhdfs://", "oci://")
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
KSERVE_HTTP_PORT = 8080   # the HTTP port of KServe's Triton serving runtime (kserve-tritonserver)
# Memory, from what `mcp-cli serve` used here (2026-12-04, RSS after bench at length 128): the server
# 39 MiB, each python-backend stub 76-85 MiB with 4-7 MB of weights. A pod also holds each stub's
# shared-memory pool (64 MiB by default, tmpfs counted against the pod) and a batch's activations:
# the server and pool base, plus per instance a working set and the weights twice (the mapped
# .mcpir and onnxruntime's copy). The limit is twice the request.
BASE_MEMORY_MIB, INSTANCE_MEMORY_MIB = 256, 192
DEFAULT_CPU_TARGET = 70          # % of the CPU request, when no tune report gives a concurrency
MANAGED_BY = {"app.kubernetes.io/managed-by": "mcp-cli"}


@dataclass
class KServeRequest:
    storage_uri: str
    namespace: str = "default"
    name: str | None = None               # the InferenceService's name (default: from the model's)
    min_replicas: int = 1
    max_replicas: int = 4
    canary_percent: int | None = None     # an update routing this % to the new revision
    promote: bool = False                 # an update making the new revision the default
    tune_report: Path | None = None
    image: str | None = None              # the server image (python-backend entries need onnxruntime in it)
    model_version: int | None = None
    service_account: str | None = None    # the pods' service account (what holds the storage credentials)
    canary_steps: list[int] | None = None  # an Argo Rollouts canary of the plain path: traffic % per step
    max_p99_ms: float | None = None       # its AnalysisTemplate aborts the rollout above this p99
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    step_pause: str = "5m"                # the pause after each step but the last
    analysis_min_requests: int = 50       # fewer canary requests in the window: inconclusive, not judged
    analysis_failure_limit: int = 1       # failed measurements the analysis allows before it aborts
    analysis_count: int | None = None     # measurements in all (None: until the rollout ends)
    kube_version: str = KUBERNETES_VERSION  # the cluster's release: what the manifests are validated against


@dataclass
class Manifests:
    files: dict[str, list[dict]]          # file name -> its documents
    service_name: str
    model_name: str
    resources: dict[str, Any]
    scaling: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    dockerfile: str | None = None
    storage_uri: str = ""                 # this revision's own repository folder (revision_uri)

    def to_dict(self) -> dict:
        return {"service": self.service_name, "model": self.model_name, "files": sorted(self.files),
                "resources": self.resources, "scaling": self.scaling, "notes": self.notes,
                "storage_uri": self.storage_uri}


VERSION_FIELD = "{version}"


def revision_uri(uri: str, revision: str) -> str:
    """The storage a revision reads, its own and immutable: `{version}` in --storage-uri replaced by
    the revision (the model version and the entry's content hash), or the revision appended as a
    folder. A canary's pods and the stable ones never share a path: a stable pod that restarts
    during a canary (an eviction, a drained node) loads its own files, not the canary's."""
    if VERSION_FIELD in uri:
        return uri.replace(VERSION_FIELD, revision)
    return uri.rstrip("/") + "/" + revision


def service_name(name: str) -> str:
    """A Kubernetes name (DNS-1035 label) from a model name: lower case, '-' for what is not
    alphanumeric; KServe adds suffixes, so at most 45 characters."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    s = re.sub(r"-{2,}", "-", s)
    if not s or not s[0].isalpha() or len(s) > 45:
        raise UsageError(f"cannot make a Kubernetes name from {name!r} (a letter first, at most 45 of a-z 0-9 -): "
                         "give --service-name")
    return s


INT32_MAX = 2**31 - 1   # Kubernetes' integer fields (replicas, targets) are int32
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# the python backend's shared memory (/dev/shm: a container's default is 64 MB): its base, and per
# instance room for the pool a stub grows to with the tensors in flight
SHM_BASE_MIB, SHM_INSTANCE_MIB = 64, 128
MAX_INSTANCES = 1024    # instances (and threads) an entry may ask a pod for


def _check_request(req: KServeRequest) -> None:
    kube_version(req.kube_version)   # before any work
    if not req.storage_uri.startswith(STORAGE_SCHEMES):
        raise UsageError(f"--storage-uri {req.storage_uri!r}: expected the model repository's folder as "
                         f"{', '.join(s + '...' for s in STORAGE_SCHEMES[:3])} (KServe downloads it)")
    rest = req.storage_uri.split("://", 1)[1]
    if any(c in rest.replace(VERSION_FIELD, "") for c in "{}"):
        raise UsageError(f"--storage-uri {req.storage_uri!r}: braces only as {VERSION_FIELD} (where the revision's "
                         "folder goes)")
    if not rest.strip("/") or any(seg in (".", "..") for seg in rest.split("/")) or \
            not rest.isascii() or any(ord(c) < 33 or ord(c) == 127 for c in rest):
        raise UsageError(f"--storage-uri {req.storage_uri!r}: expected a bucket or claim and a folder, with no "
                         "'.' or '..' segments, spaces or control characters")
    if req.image is not None and (not req.image.strip() or any(ord(c) < 33 for c in req.image)
                                  or not req.image.isascii()):
        raise UsageError(f"--image {req.image!r}: expected an image reference, e.g. registry/mcp-triton:24.10")
    if req.service_account is not None and not _DNS_SUBDOMAIN.fullmatch(req.service_account):
        raise UsageError(f"--service-account {req.service_account!r} is not a Kubernetes name (lower-case letters, "
                         "digits, '-' and '.', at most 253, a letter or digit at each end)")
    for flag, v in (("--min-replicas", req.min_replicas), ("--max-replicas", req.max_replicas)):
        if v > INT32_MAX:
            raise UsageError(f"{flag} must be at most {INT32_MAX} (a Kubernetes int32), got {v}")
    if req.canary_steps is not None:
        steps = req.canary_steps
        if not steps or any(not 1 <= w <= 100 for w in steps) or steps != sorted(set(steps)) or steps[-1] != 100:
            raise UsageError(f"--canary-steps {','.join(map(str, steps))}: give rising percentages that end at 100, "
                             "e.g. 10,30,100")
        if req.max_p99_ms is None:
            raise UsageError("--canary-steps needs --max-p99-ms: the p99 latency (ms) above which the analysis "
                             "aborts the rollout")
        if not 0.1 <= req.max_p99_ms <= 1e6:
            raise UsageError(f"--max-p99-ms {req.max_p99_ms:g}: a p99 latency between 0.1 ms and 1e6 ms")
        pause = re.fullmatch(r"([1-9][0-9]{0,4})([smh])", req.step_pause)
        if not pause:
            raise UsageError(f"--step-pause {req.step_pause!r}: a duration such as 30s, 5m or 1h")
        if int(pause.group(1)) * {"s": 1, "m": 60, "h": 3600}[pause.group(2)] > 86400:
            raise UsageError(f"--step-pause {req.step_pause}: at most 24h between canary steps")
        if req.canary_percent is not None:
            raise UsageError("--canary-percent (KServe's canary of the InferenceService) and --canary-steps (an Argo "
                             "rollout of the plain Deployment) are two ways to roll out: give one")
        from .metrics import http_url

        req.prometheus_url = http_url(req.prometheus_url, "--prometheus-url")   # as checked: stripped
        for flag, v, lo, hi in (("--analysis-min-requests", req.analysis_min_requests, 1, 10**9),
                                ("--analysis-failure-limit", req.analysis_failure_limit, 0, 1000),
                                ("--analysis-count", req.analysis_count, 1, 100_000)):
            if v is not None and not lo <= v <= hi:
                raise UsageError(f"{flag} {v}: between {lo} and {hi:,}")
        replicas = canary_replicas(req.canary_steps)
        if replicas > MAX_CANARY_PODS:
            raise UsageError(f"--canary-steps {','.join(map(str, req.canary_steps))}: without a traffic router Argo "
                             f"splits traffic by pods, and these weights need {replicas} replicas (more than the "
                             f"{MAX_CANARY_PODS} a rollout here may take); give weights that fewer pods reach, "
                             f"e.g. {_reachable_example(10)} (10 pods) or {_reachable_example(4)} (4)")
    elif req.max_p99_ms is not None:
        raise UsageError("--max-p99-ms goes with --canary-steps (the rollout it checks)")
    elif (req.analysis_min_requests, req.analysis_failure_limit, req.analysis_count) != (50, 1, None):
        raise UsageError("--analysis-min-requests, --analysis-failure-limit and --analysis-count go with "
                         "--canary-steps (the rollout's analysis)")
    if req.min_replicas < 0 or req.max_replicas < 1 or req.min_replicas > req.max_replicas:
        raise UsageError(f"--min-replicas {req.min_replicas} / --max-replicas {req.max_replicas}: need "
                         "0 <= min <= max and max >= 1")
    if req.canary_percent is not None and not 0 < req.canary_percent < 100:
        raise UsageError(f"--canary-percent must be between 1 and 99, got {req.canary_percent}")
    if req.canary_percent is not None and req.promote:
        raise UsageError("--canary-percent and --promote are two steps: route a share first, promote later")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", req.namespace):
        raise UsageError(f"--namespace {req.namespace!r} is not a Kubernetes namespace name")


KSERVE_GRPC_PORT = 9000   # KServe's Triton runtime's --grpc-port


def _streaming(container: dict[str, Any], model: str, notes: list[str]) -> None:
    """A decoupled LLM entry streams its tokens over gRPC only: Knative routes one port of a
    container, so that port is Triton's gRPC one, as h2c (REST is then not routed from outside).
    The readiness probe asks Triton's HTTP port inside the pod (a probe of the h2c port would
    speak HTTP/1 to a gRPC server), and the model is READY only after its KV-cache pool is
    allocated (an explicit --kv-cache-bytes is committed at load, not on first use)."""
    container["ports"] = [{"name": "h2c", "containerPort": KSERVE_GRPC_PORT, "protocol": "TCP"}]
    container["args"] = [*container["args"], f"--grpc-port={KSERVE_GRPC_PORT}", f"--http-port={KSERVE_HTTP_PORT}"]
    url = f"http://127.0.0.1:{KSERVE_HTTP_PORT}/v2/models/{model}/ready"
    container["readinessProbe"] = {
        "exec": {"command": ["python3", "-c", "import sys, urllib.request as u\n"
                             f"try:\n    sys.exit(u.urlopen({url!r}, timeout=2).status != 200)\n"
                             "except Exception:\n    sys.exit(1)"]},
        "periodSeconds": 5, "failureThreshold": 3}
    notes.append(f"{model} streams its tokens (a decoupled entry): the InferenceService routes Triton's gRPC port "
                 f"({KSERVE_GRPC_PORT}, h2c) and not its REST one; clients stream with gRPC (mcp-cli generate "
                 f"{model} PROMPT --url grpc://HOST:80), and it is READY once its KV-cache pool is allocated")


def resources_for(cfg: Any, local: Path) -> dict[str, Any]:
    """CPU and memory requests and limits of one server pod from the entry: weights size, instance
    count, threads; one GPU when the instances are GPU ones."""
    from tritonclient.grpc import model_config_pb2 as mc

    weights = sum(p.stat().st_size for p in local.rglob("*") if p.is_file() and p.suffix in (".mcpir", ".onnx", ".data", ".bin"))
    groups = list(cfg.instance_group) or [mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)]
    instances = sum(max(g.count, 1) for g in groups)
    gpu = any(g.kind == mc.ModelInstanceGroup.KIND_GPU for g in groups)
    threads = int_parameter(cfg, P.INTRA_OP_THREADS, digits=4, where=local.parent / "config.pbtxt")
    if instances > MAX_INSTANCES or threads > MAX_INSTANCES:   # a pod's requests come from these
        raise InvalidModelError(local.parent / "config.pbtxt", f"{instances} instances x {threads} threads: more than "
                                f"a pod is sized for (at most {MAX_INSTANCES} of each)")
    cores = instances * max(threads, 1)
    mib = BASE_MEMORY_MIB + instances * (2 * math.ceil(weights / 2**20) + INSTANCE_MEMORY_MIB)
    pool = _kv_pool_bytes(cfg, local)
    mib += math.ceil(pool / 2**20)
    mib = 64 * math.ceil(mib / 64)
    res: dict[str, Any] = {"requests": {"cpu": str(cores), "memory": f"{mib}Mi"},
                           "limits": {"cpu": str(cores), "memory": f"{2 * mib}Mi"}}
    if gpu:
        res["limits"]["nvidia.com/gpu"] = "1"
        res["requests"]["nvidia.com/gpu"] = "1"
    return {"resources": res, "weights_bytes": weights, "kv_cache_bytes": pool, "instances": instances,
            "threads": threads, "gpu": gpu}


def _kv_pool_bytes(cfg: Any, local: Path) -> int:
    """An LLM generation entry's KV-cache pool, which the pod's memory must hold beside the
    weights; its default (a tenth of the memory the server sees) would read the node's memory
    inside a pod, so a pod needs the pool's size given."""
    if P.GENERATION not in cfg.parameters:
        return 0
    try:
        gen = P.read({k: v.string_value for k, v in cfg.parameters.items()}).generation
    except ValueError as e:
        raise InvalidModelError(local.parent / "config.pbtxt", str(e)) from None
    if not gen["kv_cache_bytes"]:
        raise UsageError(f"{local.parent.name} is an LLM entry whose KV-cache pool is a share of the server's memory: "
                         "a pod's memory request must cover it, so give the pool's size (convert --kv-cache-bytes "
                         "1GiB)")
    return int(gen["kv_cache_bytes"])


def scaling_from_tune(path: Path | None, model: str, cfg: Any) -> dict[str, Any]:
    """The autoscaling metric and target: from a tune report, the concurrency that the trial whose
    setting is the entry's config (the baseline, or the best once `tune --apply` wrote it) held
    within the SLO per server; without a report, CPU utilization."""
    if path is None:
        return {"metric": "cpu", "target": DEFAULT_CPU_TARGET, "source": "no --from-tune report"}
    from mcp_compiler.files import JSON_LIMIT, parse_json, read_regular

    from .tune import Setting

    def bad(why: str) -> UsageError:
        return UsageError(f"--from-tune {path}: not a `mcp-cli tune --json` report ({why})")

    rep = parse_json(read_regular(path, "--from-tune", limit=JSON_LIMIT), f"--from-tune {path}", kind=dict)
    try:
        load, slo = str(rep["load"]), float(rep["slo_p99_ms"])
        trials = {"best": rep.get("best"), "baseline": rep["baseline"]}
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
        raise bad(f"{type(e).__name__}: {str(e)[:120]}") from None
    if not math.isfinite(slo) or slo <= 0:
        raise bad(f"slo_p99_ms {slo!r} is not a positive number")
    for k, t in trials.items():
        if t is not None and not (isinstance(t, dict) and isinstance(t.get("config"), dict)):
            raise bad(f"its {k} has no config")
    if rep.get("model") not in (None, model):
        raise UsageError(f"--from-tune {path} tuned {rep.get('model')!r}, not {model!r}")
    served = Setting.of(cfg).to_dict()
    which = next((k for k, t in trials.items() if t and t.get("config") == served), None)
    if which is None:
        raise UsageError(f"--from-tune {path}: neither its baseline nor its best is the entry's config "
                         "(tuned before the entry changed?): tune it again")
    held = trials[which]
    try:
        rps, p50 = float(held.get("throughput") or 0), float(held.get("p50_ms") or 0)
        p99 = float(held.get("p99_ms") or 0)
    except (TypeError, ValueError, OverflowError):
        raise bad(f"its {which}'s throughput, p50_ms or p99_ms is not a number") from None
    # bounds no measurement here reaches: a million requests a second, an hour a request
    if not (0 <= rps <= 1e6 and 0 <= p50 <= 3.6e6 and 0 <= p99 <= 3.6e6):
        raise bad(f"its {which}'s throughput {rps:g} req/s, p50 {p50:g} ms or p99 {p99:g} ms is outside "
                  "what a measurement gives (0-1e6 req/s, 0-3.6e6 ms)")
    if not held.get("meets_slo"):
        raise UsageError(f"--from-tune {path}: the entry's configuration (the report's {which}) did not meet "
                         f"the p99 SLO of {slo:g} ms at {load}: tune at a lower load, or `tune --apply` a better one")
    if load.startswith("concurrency "):
        parts = load.split()
        if len(parts) != 2 or not (parts[1].isascii() and parts[1].isdigit()) or not 1 <= int(parts[1]) <= INT32_MAX:
            raise bad(f"load {load[:40]!r} is not 'concurrency N' with 1 <= N <= {INT32_MAX}")
        target = int(parts[1])
    else:   # an open-loop rate: Little's law, requests in flight = throughput x latency
        target = min(INT32_MAX, max(1, math.floor(rps * p50 / 1000)))
    source = (f"{path.name}: the entry's configuration (the report's {which}) held {load} within p99 {slo:g} ms "
              f"({rps:.0f} req/s, p99 {p99:g} ms)")
    out = {"metric": "concurrency", "target": target, "source": source}
    best = trials["best"]
    if which == "baseline" and rep.get("confirmed") and best and best.get("config") != served:
        out["note"] = (f"the report confirmed a better configuration ({best.get('label')}) that the entry does not "
                       "have: `tune --apply` writes it, then write these manifests again")
    return out


def build(entry: Path, req: KServeRequest) -> Manifests:
    """The manifests for DIR/NAME (validated; nothing written)."""
    from .deploy import entry_sha256
    from .entry import Entry

    _check_request(req)
    e = Entry.read(entry, req.model_version)
    cfg, version, local, files = e.config, e.version, e.local, e.files
    model = cfg.name
    if req.name is not None and not req.name.strip():
        raise UsageError("--service-name: empty (leave it out for a name from the model's)")
    svc = req.name or service_name(model)
    if req.name and service_name(req.name) != req.name:
        raise UsageError(f"--service-name {req.name!r} is not a Kubernetes name (a letter first, at most 45 of "
                         "a-z 0-9 -)")
    res = resources_for(cfg, local)
    scaling = scaling_from_tune(req.tune_report, model, cfg)
    notes: list[str] = []
    backend = cfg.backend or cfg.platform
    dockerfile = None
    image = req.image
    if backend == "python":
        dockerfile = dockerfile_text(entry_opset(local), execution_of(cfg))
        if image is None:
            raise UsageError("give --image: this entry runs mcp-cli's python runtime on onnxruntime, which "
                             f"{TRITON_IMAGE} lacks; build one FROM it with onnxruntime, numpy<2 and flatbuffers "
                             "(`--dockerfile` prints that Dockerfile), push it, and give its name")
    else:
        notes.append(f"the {backend} backend is in {TRITON_IMAGE}: no image of your own is needed")
    if scaling.get("note"):
        notes.append(scaling.pop("note"))
    labels = {**MANAGED_BY, "app.kubernetes.io/name": svc}
    # canaries split traffic between Knative revisions: KServe's Serverless mode, said explicitly
    annotations = {"mcp-cli/model": model, "mcp-cli/triton-runtime-version": TRITON_RUNTIME_VERSION,
                   "mcp-cli/scaling-source": scaling["source"], "serving.kserve.io/deploymentMode": "Serverless"}
    # the entry's identity, deploy's content hash: a changed entry is a new revision, a rolled Deployment
    identity = {"mcp-cli/entry-sha256": entry_sha256(cfg, model, files), "mcp-cli/model-version": str(version)}
    storage = revision_uri(req.storage_uri, f"v{version}-{identity['mcp-cli/entry-sha256'][:12]}")
    notes.append(f"upload the repository (the folder holding {model}/) to {storage}: this revision reads that "
                 "folder only, and a changed entry gets another (e.g. aws s3 sync model_repository " + storage
                 + "/ ; gsutil -m rsync -r; a pvc: copy it into the claim)")
    shm = None
    if backend == "python":
        shm_mib = SHM_BASE_MIB + SHM_INSTANCE_MIB * res["instances"]
        shm = ({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_mib}Mi"}},
               {"name": "dshm", "mountPath": "/dev/shm"})
    predictor: dict[str, Any] = {
        "minReplicas": req.min_replicas, "maxReplicas": req.max_replicas,
        "scaleMetric": scaling["metric"], "scaleTarget": scaling["target"],
        "annotations": identity,
        "model": {
            "modelFormat": {"name": "triton"},
            "protocolVersion": "v2",
            "runtimeVersion": TRITON_RUNTIME_VERSION,
            "storageUri": storage,
            "args": ["--model-control-mode=explicit", f"--load-model={model}", "--strict-readiness=true"],
            "resources": res["resources"],
            # KServe's Triton runtime serves HTTP on 8080 (its --http-port), not Triton's 8000
            "readinessProbe": {"httpGet": {"path": f"/v2/models/{model}/ready", "port": KSERVE_HTTP_PORT},
                               "periodSeconds": 5, "failureThreshold": 3},
        },
    }
    if res["kv_cache_bytes"]:
        _streaming(predictor["model"], model, notes)
    if shm:
        predictor["volumes"] = [shm[0]]
        predictor["model"]["volumeMounts"] = [shm[1]]
    if req.service_account:
        predictor["serviceAccountName"] = req.service_account
    if image:
        predictor["model"]["image"] = image
    if req.canary_percent is not None:
        predictor["canaryTrafficPercent"] = req.canary_percent
        notes.append(f"canary: applied over the running InferenceService {svc}, this routes {req.canary_percent}% "
                     "to the new revision and the rest to the last ready one (KServe's Serverless mode); "
                     "`--promote` then makes it the default")
    elif req.promote:
        predictor["canaryTrafficPercent"] = 100
        notes.append(f"promote: applied over {svc}, this routes all traffic to the latest revision")
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": svc, "namespace": req.namespace, "labels": labels, "annotations": annotations},
            "spec": {"predictor": predictor}}
    if scaling["metric"] == "cpu":
        notes.append(f"autoscaling on CPU at {DEFAULT_CPU_TARGET}% of the request: give --from-tune REPORT for a "
                     "concurrency target measured on this model")
    files = {"inferenceservice.yaml": [isvc],
             "plain/triton.yaml": _plain(svc, model, req, res["resources"], image or TRITON_IMAGE, labels, annotations,
                                         identity, shm, storage)}
    if req.canary_steps:
        files["rollout/rollout.yaml"] = _rollout(files["plain/triton.yaml"][0], svc, model, req)
        pods = files["rollout/rollout.yaml"][0]["spec"]["replicas"]
        notes.append(f"rollout: an Argo Rollouts canary of the plain Deployment ({', '.join(f'{w}%' for w in req.canary_steps)}, "
                     f"{req.step_pause} between steps, {pods} replicas so that each weight is whole pods), aborted "
                     f"when the canary pods' p99 passes {req.max_p99_ms:g} ms in {req.prometheus_url} (fewer than "
                     f"{req.analysis_min_requests} canary requests in 5 min: inconclusive, the rollout pauses; "
                     "Prometheus must scrape port 8002 and keep the pod label rollouts-pod-template-hash); apply it "
                     "instead of plain/triton.yaml's Deployment")
    validate(files, kube_version(req.kube_version))
    return Manifests(files, svc, model, {k: v for k, v in res.items()}, scaling, notes, dockerfile, storage)


def canary_replicas(steps: list[int]) -> int:
    """The fewest pods at which every weight is a whole number of them: without a traffic router,
    Argo Rollouts splits traffic by pods (it rounds a weight to whole canary pods, so setWeight 10
    of 1 replica is in effect 100%, of 2 about 50%)."""
    import math

    need = 1
    for w in steps:
        need = math.lcm(need, 100 // math.gcd(w, 100))
    return need


def _reachable_example(most: int) -> str:
    """Weights `most` pods can reach: steps of the largest divisor of 100 not above it."""
    pods = max(p for p in (1, 2, 4, 5, 10, 20, 25, 50, 100) if p <= max(most, 1))
    return ",".join([str(100 * k // pods) for k in range(1, min(pods, 3))] + ["100"])


MAX_CANARY_PODS = 20          # the most replicas a rollout's weights may need
CANARY_HASH = "canary-hash"   # the AnalysisTemplate's argument: the canary pods' rollouts-pod-template-hash


def _rollout(deployment: dict, svc: str, model: str, req: KServeRequest) -> list[dict]:
    """The plain Deployment as an Argo Rollouts canary (steps of setWeight with pauses) and the
    AnalysisTemplate it runs in the background: Triton's p99 summary of the canary's pods only
    (their rollouts-pod-template-hash, the template's argument) from Prometheus against
    --max-p99-ms, the rollout aborted (back to stable) past it; fewer requests than
    --analysis-min-requests in the window is inconclusive (the rollout pauses), not a pass.
    Replicas: the fewest at which each weight is whole pods (canary_replicas)."""
    import copy

    template = copy.deepcopy(deployment["spec"]["template"])
    container = template["spec"]["containers"][0]
    container["args"] = [*container["args"], "--metrics-config=summary_latencies=true"]   # the p99 it reads
    steps: list[dict] = []
    for w in req.canary_steps or []:
        steps.append({"setWeight": w})
        if w < 100:
            steps.append({"pause": {"duration": req.step_pause}})
    analysis_name = f"{svc}-p99"
    meta = {k: v for k, v in deployment["metadata"].items()}
    replicas = max(deployment["spec"]["replicas"], canary_replicas(req.canary_steps or [100]))
    rollout = {"apiVersion": ARGO_API, "kind": "Rollout", "metadata": meta,
               "spec": {"replicas": replicas, "selector": deployment["spec"]["selector"],
                        "template": template,
                        "strategy": {"canary": {"steps": steps, "analysis": {
                            "templates": [{"templateName": analysis_name}],
                            "args": [{"name": CANARY_HASH, "valueFrom": {"podTemplateHashValue": "Latest"}}]}}}}}
    # the canary's pods only (Prometheus keeps the pod label rollouts-pod-template-hash as
    # rollouts_pod_template_hash, the usual labelmap of a pod scrape), and only with enough requests
    pods = f'model="{model}",rollouts_pod_template_hash="{{{{args.{CANARY_HASH}}}}}"'
    query = (f'(max(nv_inference_request_summary_us{{{pods},quantile="0.99"}}) / 1000) and on() '
             f'(sum(increase(nv_inference_request_success{{{pods}}}[5m])) >= {req.analysis_min_requests})')
    bound = f"{req.max_p99_ms:g}"
    metric = {"name": "p99-latency-ms", "interval": "1m", "failureLimit": req.analysis_failure_limit,
              # no data (too few requests): neither condition holds, so the measurement is inconclusive
              "successCondition": f"len(result) > 0 && result[0] <= {bound}",
              "failureCondition": f"len(result) > 0 && result[0] > {bound}",
              "provider": {"prometheus": {"address": req.prometheus_url, "query": query}}}
    if req.analysis_count is not None:
        metric["count"] = req.analysis_count
    analysis = {"apiVersion": ARGO_API, "kind": "AnalysisTemplate",
                "metadata": {"name": analysis_name, "namespace": req.namespace, "labels": meta["labels"]},
                "spec": {"args": [{"name": CANARY_HASH}], "metrics": [metric]}}
    return [rollout, analysis]


def _plain(svc: str, model: str, req: KServeRequest, resources: dict, image: str, labels: dict,
           annotations: dict, identity: dict, shm: tuple[dict, dict] | None, storage: str) -> list[dict]:
    """Deployment + Service + HPA running the same Triton on the same repository, for clusters
    without KServe: Triton reads s3:// and gs:// repositories itself; pvc:// is mounted."""
    repo, volumes, mounts = storage, [], []
    if repo.startswith("pvc://"):
        claim, _, sub = repo[len("pvc://"):].partition("/")
        volumes = [{"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}]
        mounts = [{"name": "models", "mountPath": "/mnt/models", "readOnly": True}]
        repo = "/mnt/models" + (f"/{sub}" if sub else "")
    elif not repo.startswith(("s3://", "gs://")):
        raise UsageError(f"--storage-uri {req.storage_uri!r}: the plain Deployment reads s3://, gs:// or pvc:// "
                         "(KServe's storage initializer is what reads the others)")
    selector = {"app.kubernetes.io/name": svc}
    container = {
        "name": "triton", "image": image,
        "args": ["tritonserver", f"--model-repository={repo}", "--model-control-mode=explicit",
                 f"--load-model={model}", "--strict-readiness=true"],
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
                  {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": resources,
        "readinessProbe": {"httpGet": {"path": f"/v2/models/{model}/ready", "port": HTTP_PORT},
                           "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": HTTP_PORT},
                          "initialDelaySeconds": 30, "periodSeconds": 10},
    }
    if shm:
        volumes, mounts = [*volumes, shm[0]], [*mounts, shm[1]]
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"containers": [container]}
    if volumes:
        pod["volumes"] = volumes
    if req.service_account:
        pod["serviceAccountName"] = req.service_account
    meta = {"name": svc, "namespace": req.namespace, "labels": labels,
            "annotations": {k: v for k, v in annotations.items() if not k.startswith("serving.kserve.io/")}}
    # the entry's identity in the pod template: a changed entry rolls the Deployment
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                  "spec": {"replicas": max(req.min_replicas, 1), "selector": {"matchLabels": selector},
                           "template": {"metadata": {"labels": labels, "annotations": identity}, "spec": pod}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
               "spec": {"selector": selector, "ports": [
                   # protocol written out: server-side apply keys the ports by (port, protocol), and an
                   # API server that does not default it first refuses the apply
                   {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                   {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                   {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}]}}
    # a plain HPA scales on resource metrics (concurrency needs a custom-metrics adapter): CPU
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": svc},
                    "minReplicas": max(req.min_replicas, 1), "maxReplicas": req.max_replicas,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": DEFAULT_CPU_TARGET}}}]}}
    return [deployment, service, hpa]


def image_pins(execution: str = "onnxruntime") -> dict[str, str]:
    """The python runtime's packages for the image's Python (RUNTIME_PINS); an entry that runs on
    OpenVINO adds the OpenVINO release it was verified with, this machine's (it has cp310 wheels)."""
    pins = dict(RUNTIME_PINS[IMAGE_PYTHON[TRITON_RUNTIME_VERSION]])
    if execution == "openvino":
        from importlib.metadata import PackageNotFoundError, version

        try:
            pins["openvino"] = version("openvino")
        except PackageNotFoundError:
            raise UsageError("this entry runs on OpenVINO: its image pins the OpenVINO it was verified with, "
                             "and none is installed here (pip install 'mcp-cli[openvino]')") from None
    return pins


def entry_opset(local: Path) -> int | None:
    """The ai.onnx opset of a python-backend entry's .mcpir in version folder `local` (what its
    runtime hands onnxruntime)."""
    from mcp_compiler.mcpir import read_mcpir

    f = Path(local) / "model.mcpir"
    return read_mcpir(f).opset_imports.get("", None) if f.is_file() else None


def dockerfile_text(opset: int | None = None, execution: str = "onnxruntime") -> str:
    """The server image of python-backend entries: Triton's plus the runtime's packages, pinned for
    the image's Python; an entry of an opset newer than that onnxruntime runs is refused."""
    pins = image_pins(execution)
    ort, py = pins["onnxruntime"], IMAGE_PYTHON[TRITON_RUNTIME_VERSION]
    if opset is not None and opset > ORT_MAX_OPSET[ort]:
        raise UsageError(f"this entry is opset {opset}; onnxruntime {ort}, the newest with a wheel for the Python "
                         f"{py} of {TRITON_IMAGE}, runs opset {ORT_MAX_OPSET[ort]} at most: the image cannot "
                         "serve it")
    return (f"# The server image for mcp-cli's python-backend entries: Triton {TRITON_RUNTIME_VERSION} (Python {py})\n"
            "# plus what the bundled runtime imports, at releases with a wheel for that Python.\n"
            f"FROM {TRITON_IMAGE}\n"
            "RUN pip install --no-cache-dir " + " ".join(
                f"{name}=={v}" for name, v in pins.items()) + "\n")


# -- writing and applying -------------------------------------------------------------------------

def to_yaml(docs: list[dict]) -> str:
    import yaml

    class Plain(yaml.SafeDumper):   # a label map used twice is written twice, not as &id001 / *id001
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return "".join(("---\n" if i else "") + yaml.dump(d, Dumper=Plain, sort_keys=False, default_flow_style=False)
                   for i, d in enumerate(docs))


def check_output_folder(m: Manifests, out: Path, force: bool) -> None:
    """`-o` as the other commands take an output: a folder (not a file, not a special path), and
    the manifests it already holds kept unless --force. Checked before anything is written."""
    from mcp_compiler.files import check_output

    check_output(out, "-o/--output", directory=True)   # (an empty -o is refused where it is still a string)
    names = list(m.files) + (["Dockerfile"] if m.dockerfile else [])
    there = [n for n in names if (out / n).exists()]
    if there and not force:
        raise UsageError(f"{out / there[0]} exists{f' (and {len(there) - 1} more)' if len(there) > 1 else ''}; "
                         "--force replaces the manifests")


def write(m: Manifests, out: Path) -> list[Path]:
    """Write the validated manifests (and the Dockerfile of a python-backend entry) under `out`:
    into a staging folder first, moved into place when all are written."""
    import shutil
    import tempfile

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".mcp-manifests-", dir=out))
    written = []
    try:
        texts = {name: to_yaml(docs) for name, docs in m.files.items()}
        if m.dockerfile:
            texts["Dockerfile"] = m.dockerfile
        for name, text in texts.items():
            p = stage / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        for name in texts:
            dest = out / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, dest)
            written.append(dest)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return written


def apply(m: Manifests, *, plain: bool = False, kubeconfig: str | None = None, timeout: float = 30.0) -> list[str]:
    """Create or update the manifests through the Kubernetes API (the kubeconfig's cluster): the
    InferenceService (or, with `plain`, the Deployment, Service and HPA). Returns one line per object."""
    k8s = lib("kubernetes")
    from kubernetes.client.rest import ApiException

    try:
        k8s.config.load_kube_config(config_file=kubeconfig)
    except Exception as e:  # noqa: BLE001 - the client raises ConfigException and file errors
        raise UsageError(f"no usable kubeconfig ({' '.join(str(e).split())[:300]}): write the files with -o and `kubectl apply -f` them") from None
    api = k8s.client.ApiClient()
    done = []
    docs = m.files["plain/triton.yaml"] if plain else m.files["inferenceservice.yaml"]
    for d in docs:
        kind, name, ns = d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]
        try:
            done.append(f"{kind} {ns}/{name}: {_apply_one(k8s, api, d, timeout)}")
        except ApiException as e:
            reason = e.reason or ""
            try:
                reason = json.loads(e.body).get("message", reason)
            except (TypeError, ValueError):
                pass
            raise ManifestApplyError(f"{kind} {ns}/{name}: the API server refused it ({e.status}): {reason}") from None
        except Exception as e:  # noqa: BLE001 - urllib3 connection errors
            raise ManifestApplyError(f"{kind} {ns}/{name}: cannot reach the API server: {str(e).splitlines()[0]}") from None
    return done


class ManifestApplyError(McpError):
    exit_code = 1


def _apply_one(k8s, api, d: dict, timeout: float) -> str:  # noqa: ANN001
    """Create, or replace what is there (keeping its resourceVersion): what `kubectl apply` does
    for objects this tool owns."""
    from kubernetes.client.rest import ApiException

    kind, name, ns = d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]
    t = {"_request_timeout": timeout}   # a silent API server is an error, not a hang
    if kind == "InferenceService":
        co = k8s.client.CustomObjectsApi(api)
        args = ("serving.kserve.io", "v1beta1", ns, "inferenceservices")
        get = lambda: co.get_namespaced_custom_object(*args, name, **t)  # noqa: E731
        create = lambda: co.create_namespaced_custom_object(*args, d, **t)  # noqa: E731
        replace = lambda body: co.replace_namespaced_custom_object(*args, name, body, **t)  # noqa: E731
    else:
        group = {"Deployment": (k8s.client.AppsV1Api, "deployment"), "Service": (k8s.client.CoreV1Api, "service"),
                 "HorizontalPodAutoscaler": (k8s.client.AutoscalingV2Api, "horizontal_pod_autoscaler")}[kind]
        c, stem = group[0](api), group[1]
        get = lambda: getattr(c, f"read_namespaced_{stem}")(name, ns, **t)  # noqa: E731
        create = lambda: getattr(c, f"create_namespaced_{stem}")(ns, d, **t)  # noqa: E731
        replace = lambda body: getattr(c, f"replace_namespaced_{stem}")(name, ns, body, **t)  # noqa: E731
    try:
        current = get()
    except ApiException as e:
        if e.status != 404:
            raise
        create()
        return "created"
    version = current["metadata"]["resourceVersion"] if isinstance(current, dict) else current.metadata.resource_version
    body = json.loads(json.dumps(d))
    body["metadata"]["resourceVersion"] = version
    if kind == "Service" and not isinstance(current, dict):   # a Service keeps its cluster IP
        body["spec"]["clusterIP"] = current.spec.cluster_ip
    replace(body)
    return "updated"
