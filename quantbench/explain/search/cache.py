"""The search's two caches, ``results/search/evaluations.jsonl`` and ``latency.jsonl``: append-only JSON lines,
each sealed with this machine's HMAC (analysis.resultcache.seal, the seal of the accuracy and equiv caches).

A results folder travels and anyone can edit a line, so a line is trusted only when its seal is this machine's
and every value has its type and range (`valid`); anything else (unsealed, edited, forged, ill-typed, NaN,
negative, a string, a missing key, not UTF-8, longer than MAX_LINE) is a miss: computed again and appended. The
file is read line by line (memory bounded by MAX_LINE whatever its size); a torn last line (a run killed
mid-write) is cut off, so appends start on a clean line. The file must be a regular file of its own: a symlink,
a named pipe, a folder or a device is one UserError naming it (never followed, never waited on).
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

from quantbench.analysis.resultcache import seal, sealed
from quantbench.errors import UserError
from quantbench.fsutil import canonical_json, regular_file

#: the longest line read (an evaluation over thousands of fixtures is some 100 KB); a longer one is a miss
MAX_LINE = 1 << 20
SKIP_BLOCK = 8 << 20
_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def check_file(path: Path) -> bool:
    """Whether the cache file `path` exists; a symlink or anything but a regular file is one UserError."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise UserError(f"{path}: is a symbolic link; the search keeps its cache as a file of its own results "
                        "folder and never writes through a link: remove the link")
    regular_file(path, "search cache file (remove it: the search computes it again)")
    return True


def _row(raw: bytes, valid) -> tuple[str, dict] | None:
    """(key, values) of one line when its seal is this machine's and `valid` takes its values; else None."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(row, dict):
        return None
    key, mark = row.pop("key", None), row.pop("seal", None)
    if not isinstance(key, str) or not sealed(_body(key, row), mark) or not valid(row):
        return None
    return key, row


def _body(key: str, values: dict) -> bytes:
    return canonical_json({"key": key, **values}).encode()


def _lines(fh):
    """(line bytes or None when longer than MAX_LINE, offset after it, whether it ended with a newline)."""
    at = 0
    while True:
        line = fh.readline(MAX_LINE + 1)
        if not line:
            return
        at += len(line)
        if line.endswith(b"\n") or len(line) <= MAX_LINE:
            yield line, at, line.endswith(b"\n")
            continue
        skipped, ended = _skip_line(fh)
        at += skipped
        yield None, at, ended


def _skip_line(fh) -> tuple[int, bool]:
    """(bytes skipped, whether a newline ended them) of the rest of an overlong line, read a block at a time and
    searched with bytes.find (a 1.5 GB line of junk goes at disk speed, in one block of memory)."""
    skipped = 0
    while True:
        block = fh.read(SKIP_BLOCK)
        if not block:
            return skipped, False
        end = block.find(b"\n")
        if end >= 0:
            fh.seek(end + 1 - len(block), os.SEEK_CUR)
            return skipped + end + 1, True
        skipped += len(block)


def read_cache(path, valid) -> dict:
    """{key: values} of the trusted lines of `path` (later lines win); a torn last line is cut off the file."""
    path = Path(path)
    out: dict = {}
    if not check_file(path):
        return out
    whole_end = end = 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _FLAGS)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"{path}: is not a regular file, expected the search's cache file")
        for raw, end, complete in _lines(fh):
            if not complete:
                break
            whole_end = end
            got = None if raw is None else _row(raw, valid)
            if got is not None:
                out[got[0]] = got[1]
    if end != whole_end:   # a run killed mid-line: the torn line goes, so appends start clean
        fd = os.open(path, os.O_WRONLY | _FLAGS)
        try:
            os.ftruncate(fd, whole_end)
        finally:
            os.close(fd)
    return out


def append_cache(path, key: str, values: dict) -> None:
    """One finished result, sealed, appended and flushed to disk before the search goes on (not kept when this
    machine has no secret to seal it with: it would never be trusted)."""
    path = Path(path)
    mark = seal(_body(key, values))
    if mark is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    check_file(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _FLAGS, 0o666)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(canonical_json({"key": key, **values, "seal": mark}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def count(x) -> bool:
    """A count: an int (not a bool) of 0 or more."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def finite(x, low: float = 0.0) -> bool:
    """A finite number (not a bool) of `low` or more."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= low


def strings(x) -> bool:
    return isinstance(x, list) and all(isinstance(s, str) for s in x)
