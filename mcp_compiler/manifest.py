"""The zoo manifest (zoo.yaml): a schema-checked list of models, their sources and options.

    defaults:                       # applied to every model, per-model keys win
      target: triton-v1.12
      backend: python
      serving: {max_batch_size: 8}
      verify_dims: {N: 1}
    models:
      - name: det
        source: {path: models/det.onnx}          # relative to the manifest's folder
      - name: rec
        source:
          pypi: {package: rapidocr-onnxruntime, version: 1.4.4,
                 path: rapidocr_onnxruntime/models/rec.onnx, sha256: 48fc...}
        serving: {dynamic_batch: false}
        dims: {batch: 1, T: 400}                # symbol sizes for --verify (also `verify_dims:`)
        inputs: samples/rec.npz                 # or --verify's own inputs (.npz or a folder of them)

Unknown keys and values of the wrong type are errors that name the file and line.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError


@dataclass
class Source:
    path: Path | None = None
    package: str | None = None
    version: str | None = None
    member: str | None = None        # path inside the wheel
    sha256: str | None = None

    def describe(self) -> str:
        return str(self.path) if self.path else f"{self.package}=={self.version}:{self.member}"


@dataclass
class ZooModel:
    name: str
    source: Source
    target: str = "triton-v1.12"
    backend: str = "python"
    serving: dict[str, Any] = field(default_factory=dict)
    verify_dims: dict[str, int] = field(default_factory=dict)   # `dims:` (or `verify_dims:`): symbol sizes
    inputs: Path | None = None        # `inputs:`: an .npz or a folder of them, for --verify
    line: int = 0

    def options_key(self) -> str:
        """The options as canonical JSON: part of the cache key."""
        return json.dumps({"target": self.target, "backend": self.backend, "serving": self.serving,
                           "verify_dims": self.verify_dims, "inputs": str(self.inputs or ""), "name": self.name},
                          sort_keys=True)


@dataclass
class Manifest:
    path: Path
    models: list[ZooModel]

    def digest(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def _target(c: "_Checker", node: Any, name: str):  # noqa: ANN202 - targets.Target
    from .errors import UnknownTargetError
    from .targets import get_target

    try:
        return get_target(name)
    except UnknownTargetError as e:
        raise c.fail(node, str(e)) from None


class _Checker:
    def __init__(self, path: Path, allow_outside_paths: bool = False) -> None:
        self.path = path
        self.allow_outside_paths = allow_outside_paths

    def fail(self, node: Any, msg: str) -> UsageError:
        line = node.start_mark.line + 1 if node is not None and hasattr(node, "start_mark") else "?"
        return UsageError(f"{self.path} line {line}: {msg}")

    def mapping(self, node: Any, what: str, allowed: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """{key: (key node, value node)} of a mapping node whose keys must be in `allowed`."""
        import yaml

        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping")
        out = {}
        for k, v in node.value:
            key = k.value
            if key not in allowed:
                raise self.fail(k, f"unknown key {key!r} in {what} (known: {', '.join(allowed)})")
            if key in out:
                raise self.fail(k, f"{key!r} given twice in {what}")
            out[key] = (k, v)
        return out

    def scalar(self, node: Any, what: str, kind: type) -> Any:
        import yaml

        if kind is dict or kind is list:
            data = yaml.safe_load(yaml.serialize(node))
            if not isinstance(data, kind):
                raise self.fail(node, f"{what} must be a {'mapping' if kind is dict else 'list'}")
            return data
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, f"{what} must be a {kind.__name__}")
        value = yaml.safe_load(yaml.serialize(node))
        if kind is str and not isinstance(value, str):
            value = str(value) if isinstance(value, (int, float)) and what.endswith("version") else value
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise self.fail(node, f"{what} must be a {kind.__name__}, got {value!r}")
        return value


_MODEL_KEYS = {"name": str, "source": dict, "target": str, "backend": str, "serving": dict, "verify_dims": dict,
               "dims": dict, "inputs": str}
_DEFAULT_KEYS = {k: v for k, v in _MODEL_KEYS.items() if k not in ("name", "source", "inputs")}


def load_manifest(path: str | Path, *, allow_outside_paths: bool = False) -> Manifest:
    """The checked manifest. `source.path`s must stay inside the manifest's folder (symlinks
    resolved), as external data must stay inside a model's, unless `allow_outside_paths`."""
    from .files import parse_yaml, read_config

    path = Path(path)
    text = read_config(path, "manifest")
    root = parse_yaml(text, str(path), compose=True)
    try:
        return _manifest(path, root, _Checker(path, allow_outside_paths))
    except RecursionError:
        raise UsageError(f"{path}: nesting too deep") from None


def _manifest(path: Path, root: Any, c: _Checker) -> Manifest:
    import yaml

    if root is None:
        raise UsageError(f"{path}: empty manifest")
    top = c.mapping(root, "the manifest", {"defaults": None, "models": None})
    if "models" not in top:
        raise c.fail(root, "no 'models' list")
    defaults: dict[str, Any] = {}
    if "defaults" in top:
        for key, (_kn, vn) in c.mapping(top["defaults"][1], "defaults", _DEFAULT_KEYS).items():
            defaults[key] = c.scalar(vn, f"defaults.{key}", _DEFAULT_KEYS[key])
        target_node = top["defaults"][1] if "target" in defaults else root
        default_target = _target(c, target_node, defaults.get("target", ZooModel.target))
        if "serving" in defaults:
            _check_serving(c, top["defaults"][1], defaults["serving"], "defaults.serving", default_target)
    models_node = top["models"][1]
    if not isinstance(models_node, yaml.SequenceNode) or not models_node.value:
        raise c.fail(models_node, "models must be a non-empty list")
    models, names = [], set()
    for i, mn in enumerate(models_node.value):
        fields_ = c.mapping(mn, f"models[{i}]", _MODEL_KEYS)
        for req in ("name", "source"):
            if req not in fields_:
                raise c.fail(mn, f"models[{i}] has no {req!r}")
        name = c.scalar(fields_["name"][1], f"models[{i}].name", str)
        if name in names:
            raise c.fail(fields_["name"][1], f"model name {name!r} appears twice")
        names.add(name)
        target_name = (c.scalar(fields_["target"][1], f"{name}.target", str) if "target" in fields_
                       else defaults.get("target", ZooModel.target))
        target = _target(c, fields_["target"][1] if "target" in fields_ else mn, target_name)
        try:
            target.check_entry_name(name)
        except UsageError as e:
            raise c.fail(fields_["name"][1], str(e)) from None
        source = _source(c, fields_["source"][1], path.parent, name)
        m = ZooModel(name, source, line=mn.start_mark.line + 1)
        for key in _DEFAULT_KEYS:
            if key == "dims":
                continue
            if key in fields_:
                value = c.scalar(fields_[key][1], f"{name}.{key}", _DEFAULT_KEYS[key])
                if key == "serving":
                    _check_serving(c, fields_[key][1], value, f"{name}.serving", target)
                    value = {**defaults.get("serving", {}), **value}
                elif key == "verify_dims":
                    value = {**defaults.get("verify_dims", {}), **_dims(c, fields_[key][1], value, f"{name}.{key}")}
            else:
                value = defaults.get(key, getattr(m, key))
            setattr(m, key, value)
        # `dims:` is the same as `verify_dims:` (the sizes verify and the accuracy report use)
        dims = {**_dims(c, top["defaults"][1], defaults.get("dims", {}), "defaults.dims")} if "defaults" in top else {}
        if "dims" in fields_:
            dims.update(_dims(c, fields_["dims"][1], c.scalar(fields_["dims"][1], f"{name}.dims", dict), f"{name}.dims"))
        m.verify_dims = {**m.verify_dims, **dims}
        if "inputs" in fields_:
            m.inputs = _inside(c, fields_["inputs"][1], c.scalar(fields_["inputs"][1], f"{name}.inputs", str),
                               path.parent, f"{name}.inputs")
        models.append(m)
    return Manifest(path, models)


def _check_serving(c: _Checker, node: Any, value: dict, what: str, target) -> None:  # noqa: ANN001
    from .targets.base import COMPILER_SETTINGS

    for k, v in value.items():
        if k not in target.option_types and k not in COMPILER_SETTINGS:
            raise c.fail(node, f"unknown key {k!r} in {what} (known: "
                               f"{', '.join([*target.option_types, *COMPILER_SETTINGS])})")
        err = target.type_error(k, v)
        if err:
            raise c.fail(node, f"{what}.{k} {err}")


def _dims(c: _Checker, node: Any, value: dict, what: str) -> dict[str, int]:
    """Symbol sizes: names to whole numbers 1..2**31-1."""
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 2**31 - 1:
            raise c.fail(node, f"{what}: expected symbol: size (a whole number from 1), got {k!r}: {v!r}")
    return dict(value)


def _inside(c: _Checker, node: Any, text: str, base: Path, what: str) -> Path:
    """A path of the manifest, inside its folder (unless --allow-outside-paths)."""
    p = Path(text)
    p = p if p.is_absolute() else (base / p)
    real, root = Path(os.path.realpath(p)), Path(os.path.realpath(base))
    if not c.allow_outside_paths and root not in real.parents:
        raise c.fail(node, f"{what} {p} is outside the manifest's folder {root} (--allow-outside-paths permits it)")
    return p


def _source(c: _Checker, node: Any, base: Path, name: str) -> Source:
    fields_ = c.mapping(node, f"{name}.source", {"path": str, "pypi": dict})
    if len(fields_) != 1:
        raise c.fail(node, f"{name}.source needs exactly one of path, pypi")
    if "path" in fields_:
        return Source(path=_inside(c, fields_["path"][1], c.scalar(fields_["path"][1], f"{name}.source.path", str),
                                   base, f"{name}.source.path"))
    keys = {"package": str, "version": str, "path": str, "sha256": str}
    pf = c.mapping(fields_["pypi"][1], f"{name}.source.pypi", keys)
    missing = [k for k in keys if k not in pf]
    if missing:
        raise c.fail(fields_["pypi"][1], f"{name}.source.pypi lacks {', '.join(missing)}")
    v = {k: c.scalar(pf[k][1], f"{name}.source.pypi.{k}", str) for k in keys}
    sha = v["sha256"].lower()
    if len(sha) != 64 or any(ch not in "0123456789abcdef" for ch in sha):
        raise c.fail(pf["sha256"][1], f"{name}.source.pypi.sha256 is not a sha256 hex digest")
    return Source(package=v["package"], version=v["version"], member=v["path"], sha256=sha)
