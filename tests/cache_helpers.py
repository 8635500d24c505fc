"""A cache entry builder over fsutil.build_once for the tests of tests/fsutil/ (and the processes they start)."""

from __future__ import annotations

import json
from pathlib import Path

from quantbench import fsutil


def folder_builder(entry: Path, log: list):
    """ensure(): build_once of a folder entry with a stamp beside it; `log` gets each temporary folder built."""
    stamp = entry.parent / f"{entry.name}.json"

    def done():
        return json.loads(stamp.read_text()) if stamp.exists() and entry.is_dir() else None

    def build(tmp: Path):
        log.append(tmp)
        (tmp / "data").write_text("built")
        return {"built_in": tmp.name}

    def publish(record):
        stamp.write_text(json.dumps(record))
        return record

    return lambda: fsutil.build_once(entry, done, build, publish)
