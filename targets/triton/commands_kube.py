"""`deploy --kserve`: the Kubernetes manifests of an entry, written, validated and applied."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from mcp_compiler.errors import UsageError


def percent_list(text: str | None) -> list[int] | None:
    """--canary-steps: comma-separated whole percentages (ASCII digits)."""
    if text is None:
        return None
    parts = [t.strip() for t in text.split(",")]
    if not all(t.isascii() and t.isdigit() and len(t) <= 3 for t in parts):
        raise UsageError(f"--canary-steps {text!r}: give whole percentages separated by commas, e.g. 10,30,100")
    return [int(t) for t in parts]


def kserve_command(rep, entry: Path, json_out: bool, dockerfile: bool, output: str, force: bool,  # noqa: ANN001
                   apply: bool, plain: bool, kubeconfig: Optional[str], timeout: float, check_image: bool,
                   request: dict) -> None:
    from . import kserve as ks
    from .entry import Entry, execution_of

    e = Entry.read(entry) if check_image or dockerfile else None   # read once for the check and the Dockerfile
    checked = _check_image(rep, e) if check_image else None
    if dockerfile:
        text = ks.dockerfile_text(ks.entry_opset(e.local), execution_of(e.config))
        if checked is not None:
            text = f"# checked: {checked.line()}\n{text}"
        rep.out.print(text.rstrip("\n"), markup=False)
        return
    if plain and not apply:
        raise UsageError("--plain picks what --apply applies; both are written without it")
    if request["storage_uri"] is None:
        raise UsageError("--kserve needs --storage-uri: where the model repository (the folder holding "
                         f"{Path(entry).name}/) is uploaded, e.g. s3://bucket/model_repository")
    if not output.strip():
        raise UsageError("-o/--output: give a folder for the manifests (an empty name would write into the "
                         "current folder)")
    output = Path(output)
    if apply and kubeconfig is not None:   # a FIFO or a device would block the client for ever
        from mcp_compiler.files import read_regular

        read_regular(kubeconfig, "--kubeconfig", limit=4 << 20)
    with rep.status(f"writing and validating the manifests of {entry}"):
        m = ks.build(entry, ks.KServeRequest(**request))
        ks.check_output_folder(m, output, force)
        written = ks.write(m, output)
        applied = ks.apply(m, plain=plain, kubeconfig=kubeconfig, timeout=timeout) if apply else []
    if checked is not None:
        m.notes.insert(0, f"checked: {checked.line()}")
    elif m.dockerfile is not None:
        m.notes.append(f"the image runs onnxruntime {ks.image_pins()['onnxruntime']} (the newest for its Python "
                       f"{ks.IMAGE_PYTHON[ks.TRITON_RUNTIME_VERSION]}); --check-image-runtime measures this entry on "
                       "it against the onnxruntime it was verified with")
    rep.json({**m.to_dict(), "written": [str(p) for p in written], "applied": applied,
              "image_check": checked.to_dict() if checked is not None else None})
    if json_out:
        return
    s = m.scaling
    res = m.resources["resources"]
    rep.out.print(f"{m.service_name}: InferenceService (KServe, Triton {ks.TRITON_RUNTIME_VERSION}) and a plain "
                  f"Deployment + Service + HPA for {m.model_name}", markup=False)
    rep.out.print(f"  replicas {request['min_replicas']}..{request['max_replicas']}, autoscaling on {s['metric']} "
                  f"at {s['target']}{'%' if s['metric'] == 'cpu' else ' in flight per replica'} ({s['source']})",
                  markup=False)
    rep.out.print(f"  per replica: cpu {res['requests']['cpu']}, memory {res['requests']['memory']} "
                  f"(limit {res['limits']['memory']}){', 1 GPU' if m.resources['gpu'] else ''}; weights "
                  f"{m.resources['weights_bytes'] / 2**20:.1f} MiB x {m.resources['instances']} instance(s)",
                  markup=False)
    for p in written:
        rep.out.print(f"  wrote {p}", markup=False)
    for note in m.notes:
        rep.out.print(f"  note: {note}", markup=False)
    for line in applied:
        rep.out.print(f"  applied {line}", markup=False)
    if not applied:
        rep.out.print(f"next: upload {Path(entry).parent}/ to {request['storage_uri']}, then "
                      f"kubectl apply -f {output / 'inferenceservice.yaml'}   (without KServe: kubectl apply -f "
                      f"{output / 'plain' / 'triton.yaml'})", markup=False)


def _check_image(rep, e):  # noqa: ANN001, ANN202 - a Reporter, an entry.Entry; image_runtime.ImageCheck
    """--check-image-runtime: the entry in the image's runtime against the verified one, before
    anything is written (outside its budget: VerificationError, exit 1)."""
    from . import kserve as ks
    from .entry import execution_of
    from .image_runtime import check

    with rep.status(f"checking {e.path} in the image's runtime"):
        return check(e, ks.image_pins(execution_of(e.config)), ks.TRITON_IMAGE,
                     lambda line: rep.err.print(f"note: {line}", markup=False))
