"""Check one InferenceService document (JSON on stdin) through the KServe SDK's model types;
prints {"problem": null | "what is wrong"}. Run as a child process by kserve.validate: the SDK
registers the same gRPC protos as tritonclient, so the two cannot be imported in one process.

Each mapping is built into the SDK's class for it: a key the class has no field for, a value of
the wrong type, or a missing required field (the SDK's setters raise) is the problem. Kubernetes'
own types inside it (metadata, resources, probes) are pydantic models that drop unknown keys, so
they are diffed against what they read."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": float, "object": object}


class Problem(Exception):
    pass


def _lost(a: Any, b: Any, path: str) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k, v in a.items():
            if k not in b:
                raise Problem(f"{path}.{k}: no such field")
            _lost(v, b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            _lost(x, y, f"{path}[{i}]")


def build(t: str, v: Any, path: str) -> Any:
    import kserve.models as km
    import kubernetes.client as kc

    if v is None:
        return None
    if m := re.fullmatch(r"(?:list|List)\[(.*)\]", t):
        if not isinstance(v, list):
            raise Problem(f"{path}: expected a list, got {type(v).__name__}")
        return [build(m.group(1), x, f"{path}[{i}]") for i, x in enumerate(v)]
    if m := re.fullmatch(r"dict\(str, (.*)\)|Dict\[str, (.*)\]", t):
        if not isinstance(v, dict):
            raise Problem(f"{path}: expected a mapping, got {type(v).__name__}")
        return {k: build(m.group(1) or m.group(2), x, f"{path}.{k}") for k, x in v.items()}
    if t in PRIMITIVES:
        want = PRIMITIVES[t]
        ok = want is object or isinstance(v, want) or (want is float and isinstance(v, int))
        if not ok or (want is int and isinstance(v, bool)):
            raise Problem(f"{path}: expected {t}, got {type(v).__name__}")
        return v
    cls = getattr(km, t, None) or getattr(kc, t, None)
    if cls is None:
        raise Problem(f"{path}: unknown type {t}")
    if hasattr(cls, "model_validate"):   # a Kubernetes type
        obj = cls.from_dict(v)
        _lost(v, obj.model_dump(by_alias=True, exclude_none=True), path)
        return obj
    if not isinstance(v, dict):
        raise Problem(f"{path}: expected a mapping, got {type(v).__name__}")
    field_of = {key: attr for attr, key in cls.attribute_map.items()}
    kw = {}
    for k, x in v.items():
        if k not in field_of:
            raise Problem(f"{path}.{k}: {cls.__name__} has no such field")
        kw[field_of[k]] = build(cls.openapi_types[field_of[k]], x, f"{path}.{k}")
    return cls(**kw)


def check(doc: dict) -> str | None:
    try:
        build("V1beta1InferenceService", doc, "")
    except Problem as e:
        return str(e).lstrip(".")
    except (ValueError, TypeError) as e:   # the SDK's setters; pydantic's ValidationError is a ValueError
        return str(e).splitlines()[0]
    return None


if __name__ == "__main__":
    print(json.dumps({"problem": check(json.load(sys.stdin))}))
