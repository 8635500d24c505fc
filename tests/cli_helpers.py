"""What a command's refusal looks like from outside: one `quantbench <command>: error:` line, and
a working folder whose every file is unchanged (`digest` before == `digest` after)."""

from __future__ import annotations

import os
from pathlib import Path

from quantbench.fsutil import sha256_file

#: the one file a run/equiv may create before it fails: the advisory lock of the tables folder
LOCK_NAME = ".lock"


def digest(root, skip_lock: bool = True) -> dict:
    """{relative path: sha256 (or symlink target)} of every file under root: what "nothing changed" compares."""
    root = Path(root)
    if not root.exists():
        return {}
    out = {}
    for p in sorted(root.rglob("*")):
        if skip_lock and p.name == LOCK_NAME:
            continue
        if p.is_symlink():
            out[p.relative_to(root).as_posix()] = "-> " + os.readlink(p)
        elif p.is_file():
            out[p.relative_to(root).as_posix()] = sha256_file(p)
    return out


def one_line(err: str, command: str) -> str:
    """The single `quantbench <command>: error: ...` line of stderr (progress bars aside)."""
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("quantbench")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"quantbench {command}: error: "), lines[0]
    assert "Traceback" not in err
    return lines[0]
