"""A model's lifecycle on a running Triton, in one place: load (with a config and the version
folder's files, or the repository's), wait until READY, unload, wait until unloaded, the versions
served, the config and content hash the server holds; and the request an entry accepts (smoke
feeds, as the wire carries them). bench, cold, deploy, tune and kserve call these; each talks to
the server through .client (one client per call, closed after it)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from mcp_compiler.errors import McpError, ServerError

from .client import Connection, call, client
from .entry import Entry

LOAD_TIMEOUT_S = 180.0


# -- on the server ----------------------------------------------------------------------------

def load_model(s: Any, config_json: str | None = None, files: dict[str, bytes] | None = None) -> None:
    """(Re)load s.name, with `config_json` instead of the config on disk when given (and the
    version folder's `files` uploaded, for a name the repository does not have)."""
    c = client(s.conn)
    try:
        kw = {"config": config_json} if config_json else {}
        if files:
            kw["files"] = files
        c.load_model(s.name, headers=s.conn.headers(), client_timeout=LOAD_TIMEOUT_S, **kw)
        if not c.is_model_ready(s.name, headers=s.conn.headers()):
            raise ServerError(f"{s.name} is not READY after loading")
    except McpError:
        raise
    except Exception as e:  # noqa: BLE001 - tritonclient raises many kinds
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ServerError(f"{s.conn.describe()} failed to load {s.name}: {msg}") from None
    finally:
        c.close()


def unload_model(s: Any) -> None:
    """Unload s.name if loaded; quietly (a clean-up)."""
    c = client(s.conn)
    try:
        c.unload_model(s.name, headers=s.conn.headers())
    except Exception:  # noqa: BLE001 - not loaded, or the server is going away: nothing to undo
        pass
    finally:
        c.close()


def remote_config(conn: Connection, name: str) -> Any:
    """The ModelConfig the server serves `name` with."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    c = client(conn)
    try:
        js = call(conn, f"reading the config of {name}", c.get_model_config, name, headers=conn.headers(),
                   as_json=True)
    finally:
        c.close()
    cfg = mc.ModelConfig()
    json_format.ParseDict(js.get("config", js), cfg, ignore_unknown_fields=True)
    return cfg


def ready_versions(c, conn: Connection, name: str) -> list[int]:  # noqa: ANN001 - a client
    """The versions of `name` the server has READY ([] when none, or not loaded)."""
    try:
        if not c.is_model_ready(name, headers=conn.headers()):
            return []
        md = c.get_model_metadata(name, headers=conn.headers())
    except Exception:  # noqa: BLE001 - not loaded / unknown
        return []
    versions = md["versions"] if isinstance(md, dict) else list(md.versions)
    return sorted(int(v) for v in versions)


def wait_ready(c, conn: Connection, name: str, version: int, timeout: float,  # noqa: ANN001 - a client
               error: type[ServerError] = ServerError) -> None:
    """Until `name` v`version` is READY on the server, or `error` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if c.is_model_ready(name, str(version), headers=conn.headers()):
                return
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.05)
    raise error(f"{name} v{version} not READY on {conn.describe()} after {timeout:.0f} s (--wait-timeout)")


def wait_unloaded(s: Any, timeout: float = 60.0) -> None:   # bench.Served (its conn, its name)
    """Until the server holds no READY, LOADING or UNLOADING version of s.name."""
    c = client(s.conn)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            index = c.get_model_repository_index(headers=s.conn.headers(), as_json=True).get("models", [])
            states = [m.get("state") for m in index if m.get("name") == s.name]
            if not any(st in ("READY", "UNLOADING", "LOADING") for st in states):
                return
            time.sleep(0.05)
        raise ServerError(f"{s.name} did not unload within {timeout:.0f} s")
    finally:
        c.close()


def served_sha256(c, conn: Connection, name: str) -> str | None:  # noqa: ANN001
    """The content hash in the config the server has for `name` (None: none, or not ours)."""
    try:
        cfg = c.get_model_config(name, headers=conn.headers())
    except Exception:  # noqa: BLE001 - not loaded / unknown
        return None
    if not isinstance(cfg, dict):   # gRPC: ModelConfigResponse
        cfg = {"parameters": {k: {"string_value": v.string_value} for k, v in cfg.config.parameters.items()}}
    cfg = cfg.get("config", cfg)
    return (cfg.get("parameters") or {}).get(CONTENT_KEY, {}).get("string_value")


CONTENT_KEY = "mcp_content_sha256"


# -- the request an entry accepts ---------------------------------------------------------------

def smoke_inputs(entry: Entry, inputs: str | os.PathLike | None = None, *,
                 dims: dict[str, int] | None = None, length: int | None = None,
                 notes: list[str] | None = None) -> dict[str, np.ndarray]:
    """One request the model accepts: the first sample of `inputs` (an .npz or a folder of them),
    or one from mcp_compiler.inputs (sizes from the model's own shape contracts, probed on it
    locally; `dims` fixes symbols), batch 1 where batching. With `length`, the symbols no op
    ties to a size (a sequence length, an image side) are tried at that size first (bench: a
    realistic request, not the smallest one); `notes` says what was chosen."""
    from mcp_compiler.inputs import load_inputs, make, plan, probe

    cfg = entry.config
    model, run = local_model(entry)
    if inputs is not None:
        feeds = load_inputs(inputs, model)[0]
    else:
        p = plan(model, dims, fold=False)
        batchless = [s for s in p.free if s not in (dims or {}) and not _at_axis0(p, s)]
        if length and batchless:
            try:
                q = plan(model, {**{s: length for s in batchless}, **(dims or {})}, fold=False)
                probe(model, q, run)
                p = q
                if notes is not None:
                    notes.append(f"{', '.join(batchless)} = {length} (the default request length; --dims sets it)")
            except McpError as e:
                probe(model, p, run)
                if notes is not None:
                    notes.append(f"{', '.join(batchless)} = {length} is not accepted ({str(e)[:120]}); "
                                 f"using {', '.join(f'{s}={p.sizes[s]}' for s in batchless)}")
        else:
            probe(model, p, run)
        feeds = make(model, p, np.random.default_rng(0), batch=1 if cfg.max_batch_size > 0 else None)
    return wire_feeds(cfg, feeds)


def wire_feeds(cfg: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds shaped as the model takes them -> as Triton takes them: a scalar travels as [1]
    (the runtime gives the model []), a batching model's [batch] value as [batch, 1] (the
    config's reshape gives the model [batch])."""
    batched = cfg.max_batch_size > 0
    out = {}
    for i in cfg.input:
        if i.name in feeds:
            v = feeds[i.name]
            if list(i.dims) == [1] and v.ndim == (1 if batched else 0):
                v = v.reshape(-1, 1) if batched else v.reshape(1)
            out[i.name] = v
    return out


def _at_axis0(p: Any, symbol: str) -> bool:
    return any(sh and sh[0] == symbol for sh in p.shapes.values())


def local_model(entry: Entry):  # noqa: ANN201 - (IR model, feeds -> outputs)
    """The entry's model as IR and an onnxruntime run of it here (what the checks probe)."""
    from mcp_compiler.session import create_session, quiet_options

    model = entry.model()
    sess = create_session(model, quiet_options(prepack=False))
    return model, lambda feeds: sess.run(None, feeds)
