"""The manifests' validation: core kinds against Kubernetes' schemas (kubernetes-validate),
the InferenceService through the KServe SDK's types (in a child process), Argo Rollouts' kinds
against what their documentation requires; and the `kube` extra's libraries, or one line."""

from __future__ import annotations

import json

from mcp_compiler.errors import McpError, UsageError

KUBERNETES_VERSION = "1.30.0"    # the schemas the core kinds are checked against (--kube-version's default)
MIN_KUBE_MINOR = 25              # the oldest Kubernetes whose schemas kubernetes-validate ships


def kube_version(text: str) -> str:
    """--kube-version 1.N (or v1.N.P) as the schemas' "1.N.0", checked: manifests are written for
    and validated against a release kubernetes-validate has the schemas of (1.25 and newer;
    autoscaling/v2, the HPA's, is served from 1.23)."""
    import re

    m = re.fullmatch(r"v?1\.([0-9]{1,3})(?:\.[0-9]{1,4})?", text.strip())
    if not m:
        raise UsageError(f"--kube-version {text!r}: a Kubernetes release such as 1.30 or v1.28.3")
    version = f"1.{int(m.group(1))}.0"
    known = _known_versions()
    if int(m.group(1)) < MIN_KUBE_MINOR:
        raise UsageError(f"--kube-version {text}: mcp-cli writes manifests for Kubernetes 1.{MIN_KUBE_MINOR} or newer "
                         "(the oldest it validates them against); upgrade the cluster or write your own")
    if known and version not in known:
        raise UsageError(f"--kube-version {text}: no schemas for it here (kubernetes-validate knows {known[0][:-2]} to "
                         f"{known[-1][:-2]}); pip install -U kubernetes-validate, or give one of those")
    return version


def _known_versions() -> list[str]:
    try:
        import kubernetes_validate.utils as u
    except ImportError:   # (the kube extra missing: validate() says so, in its own words)
        return []
    return sorted(set(u.all_versions()), key=lambda v: tuple(map(int, v.split("."))))
ARGO_API = "argoproj.io/v1alpha1"


class KubeLibraryError(UsageError):
    """The `kube` extra is not installed."""


def lib(module: str, *, load: bool = True):  # noqa: ANN201 - the module (None with load=False)
    """A library of the kube extra, or one line saying to install it. `load=False` only checks it
    is there (the KServe SDK is imported in a child process, see validate_kserve)."""
    import importlib
    import importlib.util

    missing = KubeLibraryError(f"{module.split('.')[0]} is not installed: pip install 'mcp-cli[kube]' "
                               "(kubernetes, kubernetes-validate, kserve)")
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise missing
    try:
        return importlib.import_module(module) if load else None
    except ImportError:
        raise missing from None


def validate(files: dict[str, list[dict]], version: str = KUBERNETES_VERSION) -> None:
    """Every document: core kinds against Kubernetes' schemas, the InferenceService through the
    KServe SDK's types (a field the SDK does not know, a wrong type or a missing required field
    fails). Raises ManifestError naming the file, the kind and the problem."""
    kv = lib("kubernetes_validate")
    for fname, docs in files.items():
        for d in docs:
            where = f"{fname}: {d.get('kind')} {d.get('metadata', {}).get('name')}"
            if d.get("apiVersion", "").startswith("serving.kserve.io/"):
                validate_kserve(d, where)
                continue
            if d.get("apiVersion") == ARGO_API:
                validate_argo(d, where, kv, version)
                continue
            try:
                kv.validate(d, version, strict=True)
            except kv.ValidationError as e:
                raise ManifestError(f"{where} does not validate against Kubernetes {version}: "
                                    f"{'.'.join(map(str, e.path)) or '(top)'}: {e.message}") from None
            except (kv.InvalidSchemaError, kv.SchemaNotFoundError) as e:
                raise ManifestError(f"{where}: no Kubernetes {version} schema: {e}") from None


class ManifestError(McpError):
    """A manifest that does not validate (never written)."""

    exit_code = 1


def validate_kserve(doc: dict, where: str) -> None:
    # The KServe SDK registers the same gRPC protos as tritonclient (inference.ServerLiveRequest):
    # both in one process fail to import, so its types check the manifest in a child process.
    import subprocess
    import sys

    lib("kserve", load=False)
    r = subprocess.run([sys.executable, "-m", "mcp_compiler.targets.triton.kserve_check"], input=json.dumps(doc),
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise ManifestError(f"{where}: the KServe SDK could not check it: "
                            f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}")
    problem = json.loads(r.stdout).get("problem")
    if problem:
        raise ManifestError(f"{where}: not a valid KServe InferenceService: {problem}")


def validate_argo(d: dict, where: str, kv, version: str = KUBERNETES_VERSION) -> None:  # noqa: ANN001 - kubernetes_validate
    """Argo Rollouts' kinds: the fields its documentation requires, and the pod template against
    Kubernetes' own schema (as a Deployment's). Its CRD schemas ship only as node validators (npm
    @kubernetes-models/argo-rollouts): the tests check the manifests against those too."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ManifestError(f"{where}: {what}")

    spec = d.get("spec")
    need(isinstance(d.get("metadata", {}).get("name"), str) and isinstance(spec, dict), "metadata.name and spec required")
    if d["kind"] == "Rollout":
        need(isinstance(spec.get("selector"), dict) and isinstance(spec.get("template"), dict),
             "spec.selector and spec.template required")
        steps = spec.get("strategy", {}).get("canary", {}).get("steps")
        need(isinstance(steps, list) and steps, "spec.strategy.canary.steps required")
        for k, st in enumerate(steps):
            need(isinstance(st, dict) and len(st) == 1 and next(iter(st)) in ("setWeight", "pause"),
                 f"steps[{k}]: one of setWeight, pause")
            if "setWeight" in st:
                need(isinstance(st["setWeight"], int) and 0 <= st["setWeight"] <= 100, f"steps[{k}].setWeight: 0..100")
        for t in spec["strategy"]["canary"].get("analysis", {}).get("templates", []):
            need(isinstance(t.get("templateName"), str), "analysis.templates[].templateName required")
        as_deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": d["metadata"],
                         "spec": {"selector": spec["selector"], "template": spec["template"]}}
        try:
            kv.validate(as_deployment, version, strict=True)
        except kv.ValidationError as e:
            raise ManifestError(f"{where}: its pod template does not validate against Kubernetes "
                                f"{version}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}") from None
    elif d["kind"] == "AnalysisTemplate":
        metrics = spec.get("metrics")
        need(isinstance(metrics, list) and metrics, "spec.metrics required")
        for m in metrics:
            prom = m.get("provider", {}).get("prometheus", {})
            need(isinstance(m.get("name"), str) and isinstance(m.get("successCondition"), str)
                 and isinstance(prom.get("address"), str) and isinstance(prom.get("query"), str),
                 "each metric needs name, successCondition, provider.prometheus.address and query")
    else:
        need(False, f"unknown {ARGO_API} kind {d['kind']}")
