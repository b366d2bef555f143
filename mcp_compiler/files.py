"""Files the CLI reads and writes: output paths checked before any work, inputs that are regular
files of bounded size, and written files whose mode follows the umask."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from .errors import InvalidModelError, OutputError, OutputExistsError, UsageError

# Kernel pseudo-filesystems: writing there is never what a user meant.
_PSEUDO = (Path("/proc"), Path("/sys"), Path("/dev"))
CONFIG_LIMIT = 1 << 20   # a build file or manifest larger than 1 MiB is not a config file


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(fd_or_path: int | str | os.PathLike, *, directory: bool = False) -> None:
    """Give a file made by tempfile (0600, or 0700 for a folder) the mode an ordinary open() would
    have given it, so that a server running as another user can read what we wrote."""
    mode = (0o777 if directory else 0o666) & ~umask()
    if isinstance(fd_or_path, int):
        os.fchmod(fd_or_path, mode)
    else:
        os.chmod(fd_or_path, mode)


def _under_pseudo(path: Path) -> bool:
    return any(path == p or p in path.parents for p in _PSEUDO)


NAME_MAX, PATH_MAX = 255, 4095


def check_output(path: Path | str, flag: str, *, directory: bool = False, force: bool | None = None,
                 inputs: tuple[Path | str | None, ...] = ()) -> Path:
    """Fail now, before any work, when `path` cannot be written: an empty name, a name or path
    longer than the system takes, a path under a regular file, /proc, /sys or /dev, or a folder
    we cannot write into. Folders that do not exist yet are allowed for `directory` outputs (they
    are made) when their first existing ancestor is a writable folder.

    A file output (`force` not None) that exists needs `force`, and is never one of `inputs`."""
    if str(path) == "":
        raise UsageError(f"{flag}: empty path")
    p = Path(os.path.abspath(path))
    if len(os.fsencode(p)) > PATH_MAX:
        raise UsageError(f"{flag}: the path is {len(os.fsencode(p))} bytes long, over the system's {PATH_MAX}")
    if long := next((part for part in p.parts if len(os.fsencode(part)) > NAME_MAX), None):
        raise UsageError(f"{flag}: the name {long[:40]}... is {len(os.fsencode(long))} bytes, over the "
                         f"system's {NAME_MAX}")
    if _under_pseudo(p):
        raise UsageError(f"{flag} {path}: cannot write under {p.parts[0]}{p.parts[1]}")
    if directory:
        if p.exists() and not p.is_dir():
            raise UsageError(f"{flag} {path} exists and is not a directory")
        anchor = p
    else:
        if p.is_dir():
            raise UsageError(f"{flag} {path} is a directory")
        if p.exists() and not p.is_file():
            raise UsageError(f"{flag} {path} exists and is not a regular file")
        if p.is_file():
            for i in inputs:
                if i is not None and Path(i).exists() and os.path.samefile(i, p):
                    raise UsageError(f"{flag} {path} is the input {i}: refusing to overwrite it")
            if force is False:
                raise OutputExistsError(f"{flag} {path} exists; --force overwrites it")
        anchor = p.parent
        if not anchor.exists() and not any(a.is_file() for a in anchor.parents):
            raise UsageError(f"{flag} {path}: folder {anchor} does not exist")
    while not anchor.exists():
        anchor = anchor.parent
    if not anchor.is_dir():
        raise UsageError(f"{flag} {path}: {anchor} is not a directory")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: folder {anchor} is not writable")
    return p


def read_regular(path: Path | str, flag: str, *, limit: int | None = None) -> bytes:
    """The bytes of a regular file: a FIFO, device or folder is refused at once (never blocks on
    a FIFO, never reads /dev/zero until memory runs out), and so is a file over `limit` bytes."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot read: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{flag} {path}: not a regular file")
        if limit is not None and st.st_size > limit:
            raise UsageError(f"{flag} {path}: {st.st_size} bytes, over the {limit >> 10} KiB limit "
                             "for this kind of file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read() if limit is None else f.read(limit + 1)
    except OSError as e:   # a file of /proc that says it is regular and fails to read (EIO)
        raise UsageError(f"{flag} {path}: cannot read: {e.strerror}") from None
    finally:
        os.close(fd)
    if limit is not None and len(data) > limit:   # a file whose size stat does not tell (/proc, /sys)
        raise UsageError(f"{flag} {path}: over the {limit >> 10} KiB limit for this kind of file")
    return data


def check_regular_input(path: Path | str, what: str = "--input") -> None:
    """A model input must be a regular file (a FIFO would block the loader forever)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise InvalidModelError(path, f"cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidModelError(path, "not a regular file" if not stat.S_ISDIR(st.st_mode) else "is a directory")


def write_error(path: Path | str, e: OSError) -> OutputError:
    """An OSError while writing `path` as the one-line error the CLI prints (ENOSPC: exit 1)."""
    if e.errno == errno.ENOSPC:
        return OutputError(f"{path}: no space left on the device")
    return OutputError(f"{path}: cannot write: {e.strerror or e}")


def read_config(path: Path | str, flag: str) -> str:
    """A YAML build file or manifest as text: a regular file of at most 1 MiB, UTF-8, no NUL."""
    data = read_regular(path, flag, limit=CONFIG_LIMIT)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UsageError(f"{flag} {path} line {line}: not UTF-8 (byte 0x{data[e.start]:02x} at offset "
                         f"{e.start})") from None
    if "\0" in text:
        line = text[:text.index("\0")].count("\n") + 1
        raise UsageError(f"{flag} {path} line {line}: a NUL byte (not a text file)")
    return text


def parse_yaml(text: str, label: str, *, compose: bool = False):  # noqa: ANN201 - YAML data or node
    """yaml.safe_load (or yaml.compose) with every failure as one UsageError line naming `label`."""
    import yaml

    from .errors import yaml_usage_error

    try:
        return yaml.compose(text, Loader=yaml.SafeLoader) if compose else yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise yaml_usage_error(label, e) from None
    except RecursionError:
        raise UsageError(f"{label}: nesting too deep") from None
    except ValueError as e:   # an integer of more digits than Python converts (4,300)
        raise UsageError(f"{label}: {str(e).split(';')[0]}") from None


_HARD_EXIT_UNDOS: dict[int, object] = {}


@contextlib.contextmanager
def undone_on_hard_exit(undo):  # noqa: ANN001, ANN201 - a callable; a context manager
    """While inside, `undo` (what removes a half-written output) runs if the process is ended by
    a watchdog (os._exit skips every finally: convert --timeout left its staging folder)."""
    key = id(undo)
    _HARD_EXIT_UNDOS[key] = undo
    try:
        yield
    finally:
        _HARD_EXIT_UNDOS.pop(key, None)


def undo_before_hard_exit() -> None:
    """Run the registered undos, newest first, each once; a failing one does not stop the rest."""
    for key in reversed(list(_HARD_EXIT_UNDOS)):
        undo = _HARD_EXIT_UNDOS.pop(key, None)
        with contextlib.suppress(Exception):
            undo()


JSON_LIMIT = 64 << 20   # characters: a JSON the tool reads (reports, config parameters, its state) is not larger


def parse_json(text: str | bytes, label: str, *, limit: int = JSON_LIMIT, kind: type | None = None):  # noqa: ANN201
    """json.loads with every failure one UsageError line naming `label`: over `limit` characters,
    not UTF-8, not JSON, NaN/Infinity (not JSON numbers), nesting too deep (a RecursionError),
    an integer of more digits than Python converts; and, with `kind`, a value of another type."""
    import json

    if len(text) > limit:
        raise UsageError(f"{label}: {len(text):,} characters, more than the {limit:,} a JSON here may be")

    def no_constant(name: str) -> float:
        raise ValueError(f"{name} is not a JSON number")

    try:
        got = json.loads(text, parse_constant=no_constant)
    except UnicodeDecodeError:
        raise UsageError(f"{label}: not UTF-8 text") from None
    except RecursionError:
        raise UsageError(f"{label}: nesting too deep") from None
    except ValueError as e:   # JSONDecodeError, no_constant, the int-digits limit
        raise UsageError(f"{label}: not JSON ({str(e).splitlines()[0][:120]})") from None
    if kind is not None and not isinstance(got, kind):
        raise UsageError(f"{label}: a JSON {type(got).__name__}, not {'an object' if kind is dict else 'a ' + kind.__name__}")
    return got


def temp_prefix(path: Path | str) -> str:
    """The prefix of the temp file or folder written beside `path` before it is renamed into
    place: `.NAME.PID.` — the pid tells a later write whether the writer is still alive.
    Stale temps of writers that died (a killed convert: up to the output's size) are removed here,
    by the next write to the same place."""
    p = Path(path)
    remove_stale_temps(p.parent if str(p.parent) else Path("."), p.name)
    return f".{p.name}.{os.getpid()}."


def remove_stale_temps(folder: Path, name: str) -> list[Path]:
    """Remove `.NAME.PID.*` temps in `folder` whose pid is no longer running; what was removed."""
    import glob
    import shutil

    gone = []
    try:
        found = list(Path(folder).glob(f".{glob.escape(name)}.*"))
    except OSError:
        return gone
    for t in found:
        pid = t.name[len(name) + 2:].split(".", 1)[0]
        if not (pid.isascii() and pid.isdigit()) or pid_alive(int(pid)):
            continue
        try:
            if t.is_dir() and not t.is_symlink():
                shutil.rmtree(t)
            else:
                t.unlink()
            gone.append(t)
        except OSError:
            pass
    return gone


def pid_alive(pid: int) -> bool:
    """Whether the process that wrote a temp (its pid in the name) may still be running."""
    if pid <= 0 or pid > 2**22:
        return True   # not a pid this kernel hands out: leave the file alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
