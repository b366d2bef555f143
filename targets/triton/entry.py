"""A repository entry (DIR/NAME) read as bounded, checked input: its config.pbtxt and its version
folders. deploy, verify, tune and kserve read an entry through here, so a tampered one (a
non-UTF-8 byte, a config of gigabytes, a version folder named `²` or `٣`, a sparse file of a
terabyte) is one error line naming the file, never an internal error or a read of the whole file
before its size is known."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from mcp_compiler.errors import InvalidModelError, UsageError

CONFIG_LIMIT = 1 << 20   # a config.pbtxt of more than 1 MiB is not one mcp-cli wrote


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


def read_files(folder: Path, limit: int, *, version: int) -> dict[str, bytes]:
    """Every file of a version folder, keyed as Triton's load request wants them
    (`file:<version>/<path>`). Sizes come from stat first: a total over `limit` bytes is refused
    before anything is read, and so is anything but a regular file or a folder."""
    files: list[tuple[str, Path]] = []
    total = 0
    for p in sorted(folder.rglob("*")):
        if "__pycache__" in p.parts or "ov_cache" in p.relative_to(folder).parts:
            continue   # (OpenVINO's compiled-model cache is this machine's, made when served here)
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
