"""A repository entry (DIR/NAME) read as bounded, checked input: its config.pbtxt and its version
folders. deploy, verify, tune and kserve read an entry through here, so a tampered one (a
non-UTF-8 byte, a config of gigabytes, a version folder named `²` or `٣`, a sparse file of a
terabyte) is one error line naming the file, never an internal error or a read of the whole file
before its size is known."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_compiler.errors import InvalidModelError, UsageError

from .runtime import params as P

CONFIG_LIMIT = 1 << 20   # a config.pbtxt of more than 1 MiB is not one mcp-cli wrote
# One gRPC message carries at most 2 GiB - 1 byte (client and Triton alike); leave room for the
# config and framing: no load request carries a bigger version folder, so none is read.
FILES_LIMIT = 2**31 - 1 - (16 << 20)
BACKENDS = ("python", "onnxruntime", "onnxruntime_onnx", "openvino")


@dataclass
class Entry:
    """DIR/NAME read once and checked (Entry.read): its config, the version the server is asked to
    serve, the newest version folder and its files as a load request carries them, and the model
    in it (the IR, built from the bytes already read)."""
    path: Path
    config: Any                     # tritonclient's ModelConfig
    version: int
    local: Path                     # the newest version folder
    files: dict[str, bytes] = field(repr=False)
    _model: Any = field(default=None, repr=False)

    @classmethod
    def read(cls, entry: str | os.PathLike, version: int | None = None) -> Entry:
        """Refused with one line naming the file: no version folder, a version below 1, an unknown
        backend, a missing model file, an .mcpir that does not pass the reader's verifier
        (truncated, corrupt), a bad name -- what the server would fail to load, before anything is sent."""
        from mcp_compiler.names import check_name

        entry = Path(entry)
        cfg = read_config(entry)
        versions = version_dirs(entry)
        if not versions:
            raise InvalidModelError(entry, "no version folder (e.g. 1/)")
        local = versions[-1][1]
        v = version if version is not None else versions[-1][0]
        if v < 1:
            raise UsageError("--version must be >= 1")
        files = read_files(local, FILES_LIMIT, version=v)
        if not cfg.name:
            cfg.name = entry.name
        e = cls(entry, cfg, v, local, files)
        e._model = e._check_files()
        check_name(cfg.name, what=f"the name in {entry / 'config.pbtxt'}")
        return e

    def _check_files(self) -> Any:
        from mcp_compiler.mcpir.reader import from_buffer

        cfg, local = self.config, self.local
        backend = cfg.backend or cfg.platform
        if backend not in BACKENDS:
            raise InvalidModelError(local.parent / "config.pbtxt", f"backend {backend!r} is not one mcp-cli "
                                    "deploys (python, onnxruntime, openvino)")
        names = {k.split("/", 1)[1] for k in self.files}
        wants = ["model.py"] if backend == "python" else ["model.onnx"]
        if backend == "python" and P.RUNTIME in cfg.parameters:
            wants.append(cfg.parameters[P.RUNTIME].string_value)
        for want in wants:
            if want not in names:
                raise InvalidModelError(local, f"no {want} for the {backend} backend")
        runtime = cfg.parameters[P.RUNTIME].string_value if P.RUNTIME in cfg.parameters else "model.mcpir"
        model = None
        for key, data in self.files.items():
            if key.endswith(".mcpir"):
                name = key.split("/", 1)[1]
                got = from_buffer(data, path=local / name)  # raises InvalidModelError
                model = got if name == runtime or model is None else model
        return model if backend == "python" else None

    def model(self) -> Any:
        """The entry's model as IR: the python backend's .mcpir (built when the entry was read), else
        its model.onnx."""
        if self._model is None:
            from mcp_compiler.frontend import load_onnx

            self._model = load_onnx(self.local / "model.onnx", check=False, infer_shapes=False).model
        return self._model


def execution_of(cfg: Any) -> str:
    """The python runtime's execution a config names (mcp_execution; onnxruntime when none)."""
    return cfg.parameters[P.EXECUTION].string_value if P.EXECUTION in cfg.parameters else "onnxruntime"


def read_config(entry: str | os.PathLike, *, missing: str | None = None) -> Any:
    """The ModelConfig of DIR/NAME/config.pbtxt. `missing` is the usage line for an entry with no
    config.pbtxt (default: "DIR: not a model repository entry")."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    entry = Path(entry)
    path = entry / "config.pbtxt"
    if not path.is_file():
        raise UsageError(missing or f"{entry}: not a model repository entry (no config.pbtxt); give DIR/NAME")
    data = _read_bounded(path, CONFIG_LIMIT)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidModelError(path, f"not a valid config.pbtxt: not UTF-8 text (byte {e.start})") from None
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as e:
        raise InvalidModelError(path, f"not a valid config.pbtxt: {e}") from None


def int_parameter(cfg: Any, key: str, *, digits: int, where: object = "config.pbtxt") -> int:
    """A whole-number parameter of a ModelConfig ("" or absent: 0). Anything else (`abc`, 10^20,
    `٣`) is one usage line naming `where` (the config's path), never an internal error or an
    integer nobody can serve."""
    text = cfg.parameters[key].string_value.strip() if key in cfg.parameters else ""
    if not text:
        return 0
    if not (text.isascii() and text.isdigit()) or len(text) > digits:
        raise UsageError(f"{where}: parameter {key} must be a whole number of at most {digits} digits, "
                         f"got {text[:20]!r}")
    return int(text)


def version_dirs(entry: str | os.PathLike) -> list[tuple[int, Path]]:
    """The version folders of DIR/NAME as (number, folder), oldest first. Only ASCII digits name
    a version (Triton's own rule: `²` or `٣` is no version folder)."""
    entry = Path(entry)
    try:
        kids = list(entry.iterdir())
    except OSError as e:
        raise InvalidModelError(entry, f"cannot list the entry: {e.strerror}") from None
    out = []
    for p in kids:
        if p.name.isascii() and p.name.isdigit() and len(p.name) <= 18 and p.is_dir():
            out.append((int(p.name), p))
    return sorted(out)


# Folders of a version folder that are this machine's, made where the entry ran: Python's
# bytecode and OpenVINO's cache (the runtime's cache_dir_for). Never uploaded, never in the
# content hash: a server makes its own (the runtime checks each file before use).
MACHINE_LOCAL = frozenset({"__pycache__", "ov_cache"})


def read_files(folder: Path, limit: int, *, version: int) -> dict[str, bytes]:
    """Every file of a version folder, keyed as Triton's load request wants them
    (`file:<version>/<path>`). Sizes come from stat first: a total over `limit` bytes is refused
    before anything is read, and so is anything but a regular file or a folder."""
    files: list[tuple[str, Path]] = []
    total = 0
    for p in sorted(folder.rglob("*")):
        if MACHINE_LOCAL.intersection(p.relative_to(folder).parts):
            continue
        st = p.lstat()
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise InvalidModelError(p, "not a regular file (a link, FIFO or device in the entry)")
        total += st.st_size
        if total > limit:
            raise UsageError(f"the version folder {folder} is over {limit / 2**30:.2f} GiB "
                             f"({p.relative_to(folder)} and those before it); one load request carries at most that")
        files.append((f"file:{version}/{p.relative_to(folder).as_posix()}", p))
    return {key: _read_bounded(p, limit) for key, p in files}


def _read_bounded(path: Path, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise InvalidModelError(path, f"cannot read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidModelError(path, "not a regular file")
        if st.st_size > limit:
            raise InvalidModelError(path, f"{st.st_size} bytes, over the {limit >> 10} KiB this file may have")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise InvalidModelError(path, f"over the {limit >> 10} KiB this file may have")
        return data
    finally:
        os.close(fd)
