"""Push a repository entry to a running Triton through its model repository extension.

`load_model(name, config=JSON, files={"file:<v>/<path>": bytes})` uploads the version folder in
the request, so the server's own repository need not be writable by the user. The config sent
carries the SHA-256 of the files and the config (`mcp_content_sha256`): a change to either changes it,
so Triton really reloads, and what the server serves can be checked against what was sent.

The last good deploy of each model on each server is kept under the state folder
(`$MCP_STATE_DIR`, default `~/.local/state/mcp-cli/deployments`) so that a later deploy whose
smoke inference fails can be rolled back with `rollback_on_failure`; `undeploy` removes it, and
at most `MCP_STATE_KEEP` (default 8) are kept, the oldest going first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mcp_compiler.errors import (
    McpError,
    ServerError,
    UsageError,
)
from mcp_compiler.names import check_name

from .client import Connection, call, client, infer_inputs, load_error
from .entry import FILES_LIMIT, Entry
from .lifecycle import CONTENT_KEY, ready_versions, served_sha256, smoke_inputs, wait_ready
from .runtime.params import GENERATION

# One gRPC message carries at most entry.FILES_LIMIT. HTTP sends files base64-encoded in one JSON
# body: past 1 GiB the client's JSON encoder was seen to crash here, so uploads over HTTP stop there.
GRPC_UPLOAD_LIMIT = FILES_LIMIT
HTTP_UPLOAD_LIMIT = 1 << 30
SMOKE_STEPS = 3   # a stateful model's smoke test: one sequence of this many requests

class DeployError(ServerError):
    """The deploy failed on the server side (load, readiness, smoke inference)."""


class NotLoadedError(ServerError):
    """undeploy: the server does not have the model loaded."""


@dataclass
class DeployReport:
    name: str
    version: int
    url: str
    upload_bytes: int
    files: list[str]
    dry_run: bool = False
    load_seconds: float | None = None
    smoke_seconds: float | None = None
    previous_versions: list[int] = field(default_factory=list)
    content_sha256: str | None = None
    unchanged: bool = False              # the server served these very files already: no reload
    rollback_copy: str | None = None     # where this deploy is kept for --rollback-on-failure
    rollback_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# -- the entry --------------------------------------------------------------------------------------

def _config_json(cfg: Any, name: str) -> str:
    from google.protobuf import json_format

    cfg.name = name
    return json_format.MessageToJson(cfg, preserving_proto_field_name=True)


def _check_size(conn: Connection, total: int) -> None:
    limit = GRPC_UPLOAD_LIMIT if conn.protocol == "grpc" else HTTP_UPLOAD_LIMIT
    if total > limit:
        raise UsageError(
            f"the version folder is {total / 2**30:.2f} GiB; one {conn.protocol} load request "
            f"carries at most {limit / 2**30:.2f} GiB ({'gRPC message limit' if conn.protocol == 'grpc' else 'HTTP body, base64'}). "
            "Use --protocol grpc (up to 2 GiB) or put the entry in the server's own repository.")


# -- state: the last good deploy, for rollback --------------------------------------------------------

def state_dir() -> Path:
    """Where deploy keeps the last good deploy of each model (for --rollback-on-failure)."""
    base = os.environ.get("MCP_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "mcp-cli")
    return Path(base) / "deployments"


def state_keep() -> int:
    """How many recorded deploys are kept in all (MCP_STATE_KEEP, default 8; 0 keeps none)."""
    text = os.environ.get("MCP_STATE_KEEP", "8").strip()
    if not (text.isascii() and text.isdigit()):
        raise UsageError(f"MCP_STATE_KEEP must be a whole number >= 0, got {text!r}")
    return int(text)


def _check_state_dir() -> None:
    """The state folder can be made and written (a file in its place, a read-only parent):
    refused before anything is sent, not found out after the new model is live."""
    root = state_dir()
    p = root
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        raise UsageError(f"the state folder {root} cannot be made: {p} is not a folder (set MCP_STATE_DIR)")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"the state folder {root} is not writable ({p}; set MCP_STATE_DIR, or MCP_STATE_KEEP=0 "
                         "to keep no rollback copy)")


def _state_path(conn: Connection, name: str) -> Path:
    check_name(name)   # the record's folder is named by it: never a path
    safe = conn.url.replace(":", "_").replace("/", "_").replace("[", "").replace("]", "")
    return state_dir() / f"{conn.protocol}_{safe}" / name


def _record(conn: Connection, name: str, config_json: str, files: dict[str, bytes]) -> tuple[Path, int] | None:
    """Keep this deploy as the one to roll back to; returns (folder, bytes), or None when
    MCP_STATE_KEEP is 0. The oldest records beyond MCP_STATE_KEEP go."""
    keep = state_keep()
    d = _state_path(conn, name)
    if keep == 0:
        if d.exists():
            _drop(d)
        return None
    tmp = d.with_name(f".{d.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "files").mkdir(parents=True)
        (tmp / "config.json").write_text(config_json)
        index = {}
        for i, (key, data) in enumerate(files.items()):
            (tmp / "files" / str(i)).write_bytes(data)
            index[key] = str(i)
        (tmp / "index.json").write_text(json.dumps(index))
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)   # no half-written copy left behind
        raise
    _prune(keep)
    return d, sum(len(b) for b in files.values()) + len(config_json)


def _prune(keep: int) -> list[Path]:
    """Remove the oldest records beyond `keep` (and server folders left empty)."""
    root = state_dir()
    if not root.is_dir():
        return []
    records = sorted((p for server in root.iterdir() if server.is_dir() for p in server.iterdir()
                      if (p / "index.json").is_file()), key=lambda p: (p / "index.json").stat().st_mtime)
    gone = records[:max(0, len(records) - keep)]
    for p in gone:
        _drop(p)
    return gone


def _drop(record: Path) -> None:
    """Remove a recorded deploy, and its server's folder when that is left empty."""
    shutil.rmtree(record, ignore_errors=True)
    if record.parent.is_dir() and not any(record.parent.iterdir()):
        record.parent.rmdir()


def forget(conn: Connection, name: str) -> Path | None:
    """Remove the recorded deploy of `name` on this server; the folder removed, if any."""
    d = _state_path(conn, name)
    if not d.exists():
        return None
    _drop(d)
    return d


def _recorded(conn: Connection, name: str) -> tuple[str, dict[str, bytes]] | None:
    d = _state_path(conn, name)
    if not (d / "index.json").exists():
        return None
    from mcp_compiler.files import parse_json, read_regular

    index = parse_json(read_regular(d / "index.json", "deploy's kept copy", limit=1 << 20), f"{d / 'index.json'}",
                       kind=dict)
    if not all(isinstance(v, str) and v.isascii() and v.isalnum() for v in index.values()):
        raise UsageError(f"{d / 'index.json'}: not deploy's index of kept files (remove {d} and deploy again)")
    config = read_regular(d / "config.json", "deploy's kept copy", limit=64 << 20).decode("utf-8", "replace")
    parse_json(config, f"{d / 'config.json'}", kind=dict)
    return config, {k: (d / "files" / v).read_bytes() for k, v in index.items()}


def reload_source(conn: Connection, name: str) -> tuple[str, dict[str, bytes]] | None:
    """What loads `name` again after an unload: None when the server's own repository has it (a
    plain load request does), else the copy deploy kept of the very content the server serves
    (config JSON and files, uploaded again). An uploaded model with no such copy here cannot be
    loaded back: an error saying so, before anything is unloaded."""
    c = client(conn)
    try:
        index = call(conn, "listing models", c.get_model_repository_index, headers=conn.headers())
        names = {r["name"] for r in index} if isinstance(index, list) else {m.name for m in index.models}
        if name in names:
            return None
        served = served_sha256(c, conn, name)
    finally:
        c.close()
    kept = _recorded(conn, name)
    if kept is not None and served is not None and json.loads(kept[0]).get("parameters", {}).get(
            CONTENT_KEY, {}).get("string_value") == served:
        return kept
    why = ("no copy of it is kept on this machine" if kept is None else
           "the copy kept on this machine is not what it serves now")
    raise UsageError(f"{name} was uploaded to {conn.describe()} (it is not in the server's repository) and {why}: "
                     "unloading it would leave it unserved. Measure the entry itself (`mcp-cli bench DIR/NAME "
                     "--cold`), or deploy it from here first")


def entry_sha256(cfg: Any, name: str, files: dict[str, bytes]) -> str:
    """What is served, as one SHA-256: the version folder's files and the config (without a
    recorded content key). The config is part of it: the same files under another config are a
    change (canonical JSON: protobuf writes a map's entries in no fixed order). deploy records it
    on the server (mcp_content_sha256); deploy --kserve carries it into the manifests."""
    c = type(cfg)()
    c.CopyFrom(cfg)
    if CONTENT_KEY in c.parameters:
        del c.parameters[CONTENT_KEY]
    canonical = json.dumps(json.loads(_config_json(c, name)), sort_keys=True)
    return content_sha256({**files, "config": canonical.encode()})


def content_sha256(files: dict[str, bytes]) -> str:
    """The SHA-256 of an upload: every file's key and bytes, in key order."""
    h = hashlib.sha256()
    for key in sorted(files):
        h.update(key.encode())
        h.update(len(files[key]).to_bytes(8, "little"))
        h.update(files[key])
    return h.hexdigest()


# -- deploy ---------------------------------------------------------------------------------------

def _smoke_generation(conn: Connection, name: str, version: int) -> None:
    """A generation entry: one token over gRPC's stream (its decoupled policy takes no other)."""
    from .client import aio_client
    from .llm_client import complete, run

    async def one() -> None:
        c = aio_client(conn)
        try:
            got = await complete(c, name, ids=[0], sampling={"max_tokens": 1, "ignore_eos": True},
                                 headers=conn.headers())
        finally:
            await c.close()
        if got.finish != "length" or len(got.ids) != 1:
            raise DeployError(f"smoke generation on {name} v{version} gave {len(got.ids)} tokens, finish {got.finish!r}")

    run(one())


def _smoke(c, conn: Connection, cfg: Any, name: str, version: int, feeds: dict) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    if GENERATION in cfg.parameters:
        _smoke_generation(conn, name, version)
        return time.perf_counter() - t0
    inputs = infer_inputs(feeds, conn.protocol)
    if cfg.HasField("sequence_batching"):
        # a stateful model: a sequence of its own, SMOKE_STEPS requests (the state carried on the
        # server from one to the next), START on the first, END on the last
        corrid = int.from_bytes(os.urandom(6), "little") + 1
        for k in range(SMOKE_STEPS):
            r = c.infer(name, inputs, model_version=str(version), headers=conn.headers(), sequence_id=corrid,
                        sequence_start=k == 0, sequence_end=k == SMOKE_STEPS - 1)
    else:
        r = c.infer(name, inputs, model_version=str(version), headers=conn.headers())
    dt = time.perf_counter() - t0
    for o in cfg.output:
        if r.as_numpy(o.name) is None:
            raise DeployError(f"smoke inference on {name} v{version} returned no {o.name!r}")
    return dt


def deploy(entry: str | os.PathLike, conn: Connection, *, name: str | None = None,
           version: int | None = None, wait_timeout: float = 600.0, dry_run: bool = False,
           smoke: bool = True, rollback_on_failure: bool = False,
           inputs: str | os.PathLike | None = None, force: bool = False,
           dims: dict[str, int] | None = None) -> DeployReport:
    """Load DIR/NAME on the server as `name` v`version`, wait for READY, smoke-test it.

    The same version already serving other files is refused unless `force` (then it is
    replaced: the config's content hash differs, so Triton reloads); the same files are not
    reloaded (`unchanged`)."""
    keep = state_keep()   # a bad MCP_STATE_KEEP is refused before the server is touched ...
    if keep and not dry_run:
        _check_state_dir()   # ... and so is a state folder that cannot hold the rollback copy
    name = check_name(name, what="--name") if name is not None else None
    e = Entry.read(entry, version)
    cfg, v, files = e.config, e.version, e.files
    name = name or cfg.name
    if CONTENT_KEY in cfg.parameters:
        del cfg.parameters[CONTENT_KEY]
    digest = entry_sha256(cfg, name, files)
    cfg.parameters[CONTENT_KEY].string_value = digest
    config_json = _config_json(cfg, name)
    total = sum(len(b) for b in files.values()) + len(config_json)
    report = DeployReport(name, v, conn.describe(), total, sorted(k.split(":", 1)[1] for k in files),
                          dry_run=dry_run, content_sha256=digest)
    _check_size(conn, total)
    # the smoke request is made (and tried locally) before anything is sent
    generation = GENERATION in cfg.parameters
    if generation and smoke and conn.protocol != "grpc":
        raise UsageError(f"{name} is an LLM generation entry: it streams over gRPC only (Triton's HTTP refuses "
                         "decoupled models); give the gRPC --url, or --no-smoke")
    if generation and inputs is not None:
        raise UsageError("--inputs: an LLM generation entry's smoke test is one generated token")
    feeds = smoke_inputs(e, inputs, dims=dims) if smoke and not dry_run and not generation else {}
    if dry_run:
        report.notes.append(f"would load {name} v{v} ({total} bytes) with config {config_json}")
        return report
    c = client(conn)
    try:
        meta = call(conn, "reading server metadata", c.get_server_metadata, headers=conn.headers())
        ext = meta["extensions"] if isinstance(meta, dict) else list(meta.extensions)
        if "model_repository" not in ext:
            raise ServerError(f"{conn.describe()} has no model repository extension; it cannot load models on request")
        report.previous_versions = ready_versions(c, conn, name)
        served = served_sha256(c, conn, name) if report.previous_versions else None
        if v in report.previous_versions and served == digest:
            report.unchanged = True
        elif v in report.previous_versions and not force:
            raise UsageError(f"{name} v{v} is serving on {conn.describe()} with other files or config"
                             f"{'' if served else ' (not deployed by mcp-cli)'}: --force replaces it, "
                             f"or give another --model-version")
        t0 = time.perf_counter()
        # sent even when unchanged (Triton then keeps the model as it is): the load request is
        # what a restricted endpoint checks the credentials of
        try:
            try:
                c.load_model(name, headers=conn.headers(), config=config_json, files=files,
                             **({"client_timeout": wait_timeout} if conn.protocol == "grpc" else {}))
            except Exception as e:  # noqa: BLE001 - tritonclient raises many kinds
                raise load_error(conn, e, name, v) from None
            wait_ready(c, conn, name, v, wait_timeout, DeployError)
        except McpError as e:
            still = ready_versions(c, conn, name)
            if report.previous_versions and still:
                raise DeployError(f"{e}; the previous version (v{', v'.join(map(str, still))}) is still serving") from None
            raise
        now = served_sha256(c, conn, name)
        if now != digest:
            raise DeployError(f"{conn.describe()} reports {name} READY but with other content "
                              f"({(now or 'none')[:12]} instead of {digest[:12]}): it did not reload")
        report.load_seconds = round(time.perf_counter() - t0, 3)
        if smoke:
            try:
                report.smoke_seconds = round(call(conn, f"smoke inference on {name} v{v}", _smoke, c, conn, cfg, name, v, feeds), 4)
            except McpError as e:
                raise _after_bad_smoke(c, conn, name, e, report, rollback_on_failure) from None
        try:
            kept = _record(conn, name, config_json, files)
        except OSError as e:   # a full disk, a folder gone read-only since the check: the deploy stands
            report.notes.append(f"{name} v{v} is deployed and serving, but its rollback copy could not be kept "
                                f"under {state_dir()}: {e.strerror or e}")
            kept = None
        if kept is not None:
            report.rollback_copy, report.rollback_bytes = str(kept[0]), kept[1]
        return report
    finally:
        c.close()


def _after_bad_smoke(c, conn: Connection, name: str, err: McpError, report: DeployReport,  # noqa: ANN001
                     rollback: bool) -> McpError:
    # Triton swapped the new version in when it loaded: the old one is gone unless restored.
    prev = _recorded(conn, name)
    if not rollback:
        hint = " (--rollback-on-failure restores the last good deploy)" if prev else ""
        return DeployError(f"{err}; the new version is loaded and the previous one is not serving{hint}")
    if prev is None:
        return DeployError(f"{err}; no earlier deploy of {name} by mcp-cli is recorded to roll back to")
    config_json, files = prev
    try:
        c.load_model(name, headers=conn.headers(), config=config_json, files=files)
        old_v = int(next(iter(files)).split(":", 1)[1].split("/", 1)[0])
        wait_ready(c, conn, name, old_v, 120, DeployError)
    except Exception as e:  # noqa: BLE001
        return DeployError(f"{err}; rolling back failed too: {e}")
    return DeployError(f"{err}; rolled back: v{old_v} is serving again")


def _rows(c, conn: Connection) -> list[dict]:  # noqa: ANN001
    """The repository index, and the uploaded models it leaves out (found in the statistics)."""
    index = call(conn, "listing models", c.get_model_repository_index, headers=conn.headers())
    rows = [dict(r) for r in index] if isinstance(index, list) else [
        {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason} for m in index.models]
    seen = {r["name"] for r in rows}
    stats = call(conn, "reading statistics", c.get_inference_statistics, headers=conn.headers())
    entries = stats["model_stats"] if isinstance(stats, dict) else [
        {"name": s.name, "version": s.version} for s in stats.model_stats]
    for s in entries:
        if s["name"] not in seen:
            ready = call(conn, "reading readiness", c.is_model_ready, s["name"], s.get("version", ""),
                          headers=conn.headers())
            rows.append({"name": s["name"], "version": s.get("version", ""),
                         "state": "READY" if ready else "UNAVAILABLE", "reason": "uploaded"})
            seen.add(s["name"])
    for r in rows:
        r["version"] = str(r.get("version") or "")
        r["state"] = r.get("state") or "NOT LOADED"   # in the repository, never loaded
        r["reason"] = r.get("reason") or ""
    return sorted(rows, key=lambda r: (r["name"], r["version"]))


def status(conn: Connection) -> list[dict]:
    """Every model the server knows: name, version, state (READY, LOADING, UNLOADING,
    UNAVAILABLE, NOT LOADED) and the server's reason."""
    c = client(conn)
    try:
        return _rows(c, conn)
    finally:
        c.close()


def undeploy(name: str, conn: Connection, *, wait_timeout: float = 300.0) -> dict:
    """Unload `name` and wait until the server has let it go (not READY, not UNLOADING); remove
    the recorded deploy. A model the server does not have loaded (unknown, or unloaded already)
    is an error, not a silent success. Returns {state, seconds, forgot}."""
    check_name(name, what="the model name")
    c = client(conn)
    try:
        call(conn, "reading server metadata", c.get_server_metadata, headers=conn.headers())
        if not ready_versions(c, conn, name):
            raise NotLoadedError(f"{name} is not loaded on the server {conn.describe()}")
        t0 = time.perf_counter()
        call(conn, f"unloading {name}", c.unload_model, name, headers=conn.headers())
        deadline = time.monotonic() + wait_timeout
        while True:
            mine = [r for r in _rows(c, conn) if r["name"] == name]
            states = {r["state"] for r in mine}
            if not ready_versions(c, conn, name) and not states & {"READY", "UNLOADING", "LOADING"}:
                state = "UNAVAILABLE" if mine else "UNLOADED"
                break
            if time.monotonic() > deadline:
                raise DeployError(f"{name} still {'/'.join(sorted(states)) or 'READY'} on {conn.describe()} "
                                  f"after {wait_timeout:.0f} s (--wait-timeout)")
            time.sleep(0.1)
        gone = forget(conn, name)
        return {"state": state, "seconds": round(time.perf_counter() - t0, 3),
                "forgot": str(gone) if gone else None}
    finally:
        c.close()
