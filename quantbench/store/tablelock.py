"""The write lock of a tables folder, and what taking it cleans: the stale parts of runs that died and the
parts whose footer cannot be read (set aside by quarantine).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from quantbench.store.resultpaths import TABLES_DIR, check_confined
from quantbench.errors import UserError, flag_mark
from quantbench.fsutil import clean_stale_tmp, disk_full, no_space
from quantbench.store import partread


LOCK_FILE = ".lock"


def _lock_holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "another process"


@contextlib.contextmanager
def lock(root: str | os.PathLike = TABLES_DIR, wait: bool = True):
    """Hold the advisory write lock of a tables folder (`fcntl.flock` on <root>/.lock).

    `quantbench run` and `equiv` hold it for their whole duration, so two of them on one
    results folder take turns instead of both doing every run. A second command waits,
    saying so on stderr, or with wait=False fails at once (a UserError naming the holder).
    The lock file holds the holder's pid while held and is empty otherwise; it is never
    removed (removing a flock file races with the next locker).
    """
    import fcntl
    import sys

    root = check_confined(root)
    for d in sorted(root.iterdir()) if root.is_dir() else ():   # a table's folder linked out: refused before any run
        check_confined(d)
    path = root / LOCK_FILE
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise UserError(f"{path}: cannot create the tables lock file ({exc.strerror})") from None
    with os.fdopen(fd, "r+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(path)
            if not wait:
                raise UserError(f"{root}: locked by {holder} (another quantbench run or equiv is writing these "
                                f"tables); retry when it ends, or drop {flag_mark('no_wait')} to wait for it") from None
            sys.stderr.write(f"waiting for the lock on {root} held by {holder} ...\n")
            sys.stderr.flush()
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:  # unbuffered: a full disk fails here, once, never again when the file closes
            os.ftruncate(fh.fileno(), 0)
            try:
                os.pwrite(fh.fileno(), f"{os.getpid()}\n".encode(), 0)
            except OSError as exc:
                raise (disk_full(path, exc, "the tables lock was not taken") if no_space(exc) else exc) from None
            clean_stale_parts(root)
            partread.quarantine_unreadable(root)
            partread.HELD_ROOTS.add(partread.resolved_root(root))
            yield path
        finally:
            partread.HELD_ROOTS.discard(partread.resolved_root(root))
            os.ftruncate(fh.fileno(), 0)
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def clean_stale_parts(root: str | os.PathLike = TABLES_DIR) -> list[Path]:
    """Remove the temporary parts, ledger files and input stores of runs that died (SIGKILLed); returns them.

    A live writer's file (its pid still runs) is never touched, even one of a command that does not take the lock.
    """
    removed = clean_stale_tmp(root)  # a killed run's input store (runs/runner.py)
    for d in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.is_symlink()):
        removed += clean_stale_tmp(d) + clean_stale_tmp(d / ".ledger")
    return removed
