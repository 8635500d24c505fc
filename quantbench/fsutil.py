"""Atomic file writes, caches built on first use, and file hashing.

Every file quantbench writes goes through here: write to a temporary file in
the destination folder, fsync, then rename, so a crash never leaves a
half-written file and a reader never sees one. Every cache entry built on first
use under QUANTBENCH_HOME (a masked copy, a root, wheels, a prefix, a tool) is
built by build_once: once per entry, by one builder under a lock beside it, in
a temporary of its own, renamed into place; other threads and commands wait.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from quantbench.errors import DiskFull, NotWritable, ParameterError, UserError, flag_mark


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` on success.

    For writers that want a file name (pyarrow, onnx.save). The temporary file
    is removed if the block raises.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # named with its owner, so a SIGKILLed writer's leftover can be told from a live one's (clean_stale_tmp)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{owner_tag()}.", suffix=suffix + ".tmp", dir=path.parent)
    except OSError as exc:
        if read_only(exc):   # a read-only or foreign folder: the user's to fix, one line naming it
            raise cannot_write(path.parent, exc, f"{path.name} was not written") from None
        raise (disk_full(path, exc) if no_space(exc) else exc) from None
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a result file is as readable as any other
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if no_space(exc):  # a full disk is the user's to fix: one line naming the file, not a traceback
            raise disk_full(path, exc) from None
        raise


#: errno values that mean "the disk (or the user's quota) is full"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in NO_SPACE


def has_room(folder: str | os.PathLike, need: int) -> bool:
    """Whether the file system holding `folder` has `need` bytes free for an unprivileged writer (statvfs
    f_bavail); True when it cannot tell. For writers that do not report a short write (onnx's and onnxruntime's
    C++ leave a truncated file): what they failed at, with less room than they need, was a full disk."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return True
    return st.f_bavail * st.f_frsize >= need


def no_space_error(path: str | os.PathLike | None = None) -> OSError:
    """The OSError a write that found no space raises (errno ENOSPC), naming `path` when given: for a writer that
    did not raise it itself (has_room)."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([str(path)] if path is not None else []))


def disk_full(path: str | os.PathLike, exc: OSError, what: str = "it was not written") -> DiskFull:
    """The one wording of a full disk: the file that could not be written, and what to do."""
    return DiskFull(f"{path}: {exc.strerror or 'No space left on device'} (errno {exc.errno}); {what}: "
                    "free some space and rerun", path)


def owner_tag() -> str:
    """`<pid>@<8 hex of the host name>`: who owns a temporary file or folder (a pid means nothing elsewhere)."""
    import socket

    return f"{os.getpid()}@{hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (another user's), or cannot tell: keep its files
    return True


#: `.<name>.<pid>@<host>.<random>[.<suffix>].tmp`: atomic_path's files and variants.staging_folder's folders
_OWNED_TMP = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)@(?P<host>[0-9a-f]{8})\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9]+)?\.tmp")


def stale_tmp(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """The temporary files and folders in `folder` left by writers that died (SIGKILL, power loss).

    Only names made by atomic_path or staging_folder (for `name`'s destination only, when given),
    owned by this machine and by a pid that no longer exists: a live writer's file is never listed.
    """
    me = owner_tag().split("@")[1]
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError:
        return []
    out = []
    for p in entries:
        m = _OWNED_TMP.fullmatch(p.name)
        if not m or m["host"] != me or (name is not None and m["name"] != name) or p.is_symlink():
            continue
        if int(m["pid"]) != os.getpid() and not pid_alive(int(m["pid"])):
            out.append(p)
    return out


def replace_dir(tmp: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Move the finished folder `tmp` into place at `final` (the one owner of that step). An old `final` (folder,
    file or link) is renamed aside first and removed after, so `final` is always either the old or the new one."""
    import shutil

    tmp, final = Path(tmp), Path(final)
    if not (final.exists() or final.is_symlink()):
        os.replace(tmp, final)
        return final
    trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
    os.replace(final, trash / "x")
    os.replace(tmp, final)
    shutil.rmtree(trash, ignore_errors=True)
    return final


@contextlib.contextmanager
def entry_lock(path: str | os.PathLike, waiting=None) -> Iterator[None]:
    """Hold the build lock of the cache entry `path` (`fcntl.flock` on `.<name>.lock` beside it): one builder at a
    time, thread or process. A caller that finds it held calls `waiting()` (when given) and waits. The lock file
    is never removed (removing a flock file races with the next locker)."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            gate_mark("waiting", path)
            if waiting is not None:
                waiting()
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def temp_beside(path: str | os.PathLike, folder: bool = True) -> Path:
    """A new empty temporary folder (or file) beside `path`, unique to its builder (thread or process) and named
    with its owner, so stale_tmp finds the one a killed builder left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.{owner_tag()}."
    if folder:
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=path.parent))
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def build_once(path: str | os.PathLike, done, build, publish=None, folder: bool = True, waiting=None):
    """The cache entry `path` that quantbench builds on first use (a masked copy, a root, a wheel folder, a
    prefix, a tool), built once per key by one builder while the others wait and then use it: (record, built).

    `done()` is the entry's record when it is in place, else None: asked first without the lock (the common
    case), then again under entry_lock (another builder may have finished while this one waited; `waiting` is
    called when it must wait). `build(tmp)` fills a temporary folder (or file, `folder=False`) of this builder's
    own beside `path` and returns a value; the temporary then replaces `path` atomically and `publish(value)`
    (writing the stamp beside it, say) runs, still under the lock; its result (else the value) is the record. A
    build that fails removes its temporary and leaves the old entry, if any, as it was; the temporary a killed
    builder left is removed by the next build."""
    found = done()
    if found is not None:
        return found, False
    with entry_lock(path, waiting):
        found = done()
        if found is not None:
            return found, False
        clean_stale_tmp(Path(path).parent, Path(path).name)  # a killed builder's temporary (never a live one's)
        tmp = temp_beside(path, folder)
        try:
            gate_mark("building", Path(path), wait=True)
            made = build(tmp)
            replace_dir(tmp, path) if folder else os.replace(tmp, path)
        except BaseException:
            remove_tree(tmp)
            raise
        return (publish(made) if publish is not None else made), True


def remove_tree(path: str | os.PathLike) -> None:
    """Remove a folder, file or link if it is there (a failed build's temporary)."""
    import shutil

    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


BUILD_GATE = "QUANTBENCH_TEST_BUILD_GATE"


def gate_mark(step: str, entry: Path, wait: bool = False) -> None:
    """Test-only hook (costs nothing when unset): with QUANTBENCH_TEST_BUILD_GATE=DIR, a builder that has made
    its temporary ("building") or a caller that found the build lock held ("waiting") leaves
    DIR/<step>.<entry name>.<owner>.<thread>; a builder then waits until DIR/go.<entry name> exists. Tests see
    two builders of one entry overlap for certain (no timing)."""
    gate = os.environ.get(BUILD_GATE)
    if not gate:
        return
    import threading
    import time

    Path(gate, f"{step}.{entry.name}.{owner_tag()}.{threading.get_ident()}").touch()
    while wait and not Path(gate, f"go.{entry.name}").exists():
        time.sleep(0.05)


def clean_stale_tmp(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove stale_tmp(folder, name); returns what was removed."""
    import shutil

    removed = stale_tmp(folder, name)
    for p in removed:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def canonical_json(obj) -> str:
    """JSON with sorted keys and fixed separators: same object, same bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def atomic_write_json(path: str | os.PathLike, obj, indent: int | None = 2) -> Path:
    text = json.dumps(obj, sort_keys=True, indent=indent, ensure_ascii=True, default=str) + "\n"
    return atomic_write_text(path, text)


def content_key(data) -> str:
    """What a derived file or figure is made from, hashed: the same key means the same result."""
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def key_path(path: str | os.PathLike) -> Path:
    """Where the key of the file at `path` is kept: a hidden file beside it."""
    path = Path(path)
    return path.parent / f".{path.name}.key"


def made_from(path: str | os.PathLike, key: str) -> bool:
    """The file at `path` was made from the data with `key` (its key file matches): no need to make it again."""
    try:
        return Path(path).exists() and key_path(path).read_text().strip() == key
    except OSError:
        return False


def write_key(path: str | os.PathLike, key: str) -> Path:
    """Record that the file at `path` (already written) was made from the data with `key`."""
    return atomic_write_text(key_path(path), key + "\n")


def file_state(path: str | os.PathLike) -> list | None:
    """What changes whenever a file's bytes do: size, mtime, ctime (any write moves it, and it cannot be set back),
    inode, device; None when the file cannot be stat-ed. Something worked out from a file and kept with its state
    is still the file's while the state matches."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def cache_on(env: str) -> bool:
    """Whether the cache the environment variable `env` switches is on (0, no, false or off: off)."""
    return os.environ.get(env, "1").lower() not in ("0", "no", "false", "off")


def keep_newest(folder: str | os.PathLike, pattern: str, keep: int) -> None:
    """Remove all but the `keep` most recently written files of `folder` matching `pattern` (a bounded cache)."""
    def written(f: Path) -> int:
        try:
            return f.stat().st_mtime_ns
        except OSError:
            return 0

    for old in sorted(Path(folder).glob(pattern), key=written)[:-keep]:
        with contextlib.suppress(OSError):
            old.unlink()


def write_cache_entry(path: str | os.PathLike, obj, keep: int) -> None:
    """Write a cache entry (compact JSON, atomically) and keep only the `keep` newest files of its folder; an
    entry that cannot be written is no error (a cache not written is only slower next time)."""
    try:
        atomic_write_json(path, obj, indent=None)
        keep_newest(Path(path).parent, "*.json", keep)
    except OSError:
        pass


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


#: how many times its stored size data arriving from elsewhere (an archive's members, an export's Parquet tables)
#: may decode to: quantbench's files are compressed already, so an honest one inflates about 1-2x (identical hosts'
#: tensors a few times more); one declaring or decoding to far more is refused before the rest is read (a 1.5 GiB
#: member of zeros, a 560 KB export of rows repeated 100,000 times that decoded to 3.5 GB)
MAX_EXPANSION = 64
EXPANSION_SLACK = 1 << 20


def expansion_limit(stored: int) -> int:
    """The most bytes `stored` bytes from elsewhere may decode to (MAX_EXPANSION times, and EXPANSION_SLACK)."""
    return MAX_EXPANSION * stored + EXPANSION_SLACK


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """`path`, checked to be a regular file before anything opens it: a folder, a named pipe, a device (/dev/zero)
    or a socket is one UserError naming it and what was expected (`what`: "model", "image", "hosts file" ...).
    Only stat is asked (it follows links and never blocks, where opening a FIFO waits for a writer). A missing
    file is left to the caller to word (each has its own "not found")."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: is {file_kind(mode)}, expected a {what} (a regular file)")
    return path


def file_kind(mode: int) -> str:
    """What a stat mode is, in words ("a named pipe (FIFO)", "a folder", "a regular file" ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_user_bytes(path: str | os.PathLike, what: str = "file", limit: int | None = None) -> bytes:
    """The bytes of the user's file `path` (regular_file), at most `limit` bytes (more: one UserError naming the
    size and the limit, nothing read). Opened without blocking and checked again on the open file, so a file
    swapped for a FIFO between the two checks is refused too. A missing file raises FileNotFoundError."""
    path = regular_file(path, what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: is not a regular file, expected a {what}")
        if limit is not None and st.st_size > limit:
            raise UserError(f"{path}: {what} is {st.st_size:,} bytes, more than the limit of {limit:,}")
        data = fh.read() if limit is None else fh.read(limit + 1)
    if limit is not None and len(data) > limit:  # grew while read
        raise UserError(f"{path}: {what} is more than the limit of {limit:,} bytes")
    return data


#: the largest settings file read (a hosts file, quantbench.toml, pyproject.toml): one with thousands of hosts
#: is some 100 KB
MAX_SETTINGS_BYTES = 1 << 20


def read_user_text(path: str | os.PathLike, what: str = "file", limit: int | None = None) -> str:
    """read_user_bytes as UTF-8 text; unreadable or not UTF-8: one UserError naming the file and `what`."""
    try:
        return read_user_bytes(path, what, limit).decode("utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: cannot read the {what} (not UTF-8 text: {exc.reason} at byte {exc.start})") from None


def parse_toml(path: str | os.PathLike, text: str) -> dict:
    """The TOML document `text` (read from `path`); a syntax error names the line and shows it, a document nested
    too deeply for the parser is one error too."""
    import tomllib

    try:
        return tomllib.loads(text)
    except RecursionError:
        raise UserError(f"{path}: not valid TOML (nested too deeply)") from None
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        if m:
            line = int(m.group(1))
            lines = text.splitlines()
            src = lines[line - 1].strip() if line <= len(lines) else ""
            raise UserError(f"{path}:{line}: not valid TOML ({msg[:m.start()].strip()}, column {m.group(2)}): "
                            f"{src!r}") from None
        raise UserError(f"{path}: not valid TOML ({msg})") from None


#: the largest JSON file (labels, sidecar, index, record) read: a COCO file of 100,000 images is about 60 MB
MAX_JSON_BYTES = 1 << 30


def read_json(path: str | os.PathLike, what: str = "JSON", hint: str = "", error=None, limit: int = MAX_JSON_BYTES):
    """The JSON in `path`; unreadable or invalid JSON is one error naming the file, `what` it should be and `hint`.
    A file over `limit` bytes is refused before it is read (read_user_bytes).

    `error` is the exception class (default quantbench.errors.UserError); a missing
    file raises FileNotFoundError for the caller to word.
    """
    import json

    path = Path(path)
    try:
        return json.loads(read_user_bytes(path, what, limit).decode("utf-8"))
    except FileNotFoundError:
        raise
    except RecursionError:  # nested deeper than Python's stack: no JSON quantbench reads is nested like that
        raise (error or UserError)(f"{path}: not a readable {what} (nested too deeply)"
                                   f"{'; ' + hint if hint else ''}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise (error or UserError)(f"{path}: not a readable {what} ({exc}){'; ' + hint if hint else ''}") from None


def read_cached_json(path: str | os.PathLike):
    """What a cache entry or set-up stamp holds, or None when it is missing, torn or not JSON: its owner then
    rebuilds it (never an error: such files are quantbench's own, not the user's)."""
    import json

    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


STAGING = ".staging"
KILL_AT = "QUANTBENCH_TEST_KILL_AT"


KILL_SIGNAL = "QUANTBENCH_TEST_KILL_SIGNAL"


def kill_point(step: str) -> None:
    """Test-only hook (costs nothing when unset): with the environment variable QUANTBENCH_TEST_KILL_AT=step,
    the process SIGKILLs itself here, so tests see exactly what a kill at that step leaves (no timing);
    QUANTBENCH_TEST_KILL_SIGNAL=INT (or TERM ...) sends that signal instead (a Ctrl-C at that step)."""
    if os.environ.get(KILL_AT) == step:
        import signal

        os.kill(os.getpid(), getattr(signal, "SIG" + os.environ.get(KILL_SIGNAL, "KILL").upper()))


def staging_area(results_dir: str | os.PathLike) -> Path:
    """Where commands keep their temporary files under a results folder (results/.staging/).

    Each run works in its own folder there (quantbench.inputs.variantdir.staging_folder: named after its
    pid, removed when it ends, and by the next run when it was killed): nothing goes to the
    system's temporary folder, and nothing is archived (hidden)."""
    return Path(results_dir) / STAGING


#: errno values that mean "this folder takes no new file": a read-only file system, no permission
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def read_only(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in READ_ONLY


def cannot_write(folder: str | os.PathLike, exc: OSError, why: str = "") -> NotWritable:
    """The one wording of a folder that takes no new file (read-only, no permission): the folder, the reason."""
    return NotWritable(f"{folder}: cannot write there ({exc.strerror or exc}){'; ' + why if why else ''}", exc.errno)


def check_writable(folder: str | os.PathLike, why: str = "") -> Path:
    """`folder` (an existing folder) takes a new file; else one UserError naming it (nothing is left)."""
    folder = Path(folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".write-test.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise cannot_write(folder, exc, why) from None
    return folder


def check_new_file(path: str | os.PathLike, param: str, force: bool = False, folder_made: bool = False) -> Path:
    """`path` may take a file the caller is about to write (parameter `param`): ParameterError when it is a folder,
    when its folder does not exist (unless the caller makes it: `folder_made`), or when a file is there and `force`
    does not say to replace it."""
    path = Path(path)
    if path.is_dir():
        raise ParameterError(param, "is a folder, not a file; nothing was written", str(path))
    if not folder_made and not path.parent.is_dir():
        raise ParameterError(param, f"its folder {path.parent} does not exist; nothing was written", str(path))
    if (path.exists() or path.is_symlink()) and not force:
        raise ParameterError(param, f"exists; {flag_mark('force')} replaces it (nothing was written)", str(path))
    return path


def inside(folder: str | os.PathLike, rel, base: Path | None = None) -> Path | None:
    """folder/rel if `rel` is a relative path that resolves (symlinks followed) inside `folder`, else None.

    `base`: `folder` resolved already (Path.resolve), for a caller checking many names in one folder."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or "\\" in rel or "\x00" in rel:
        return None
    base = Path(folder).resolve() if base is None else base
    if not _plain_under(str(base), rel):
        target = (Path(folder) / rel).resolve()
        if target == base or base not in target.parents:
            return None
    return Path(folder) / rel


def _plain_under(base: str, rel: str) -> bool:
    """Whether base/rel is its own resolved path: every component of `rel` is a name ('.', '..' and empty ones
    are not) of an existing entry that is no symlink. Then it is inside `base` without resolving it."""
    path = base
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            return False
        path = os.path.join(path, part)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return False
        except (OSError, ValueError):
            return False
    return True


def check_writable_for(path: str | os.PathLike, why: str = "") -> Path:
    """The folder that would take `path` (a file or folder to be made: its nearest existing ancestor) takes a new
    file; else one UserError naming that folder, before anything is written."""
    folder = Path(path).absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return check_writable(Path(os.path.relpath(folder)) if folder.is_relative_to(Path.cwd()) else folder, why)
