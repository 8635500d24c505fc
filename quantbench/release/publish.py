"""`quantbench release --tag NAME [--archive]`: build a release and its archive, recoverably.

A release is published in steps (staging folder, rename into place, registry entry, then the
archive), each of which a kill can interrupt. A rerun of the same command picks up where the
killed one stopped and never overwrites a finished release:

- killed before the folder was renamed into place: the staging leftover is removed and the
  release is made;
- killed after the rename but before the registry named the tag (the folder still holds its
  `.unfinished` marker): the unfinished folder is made again (record.build_release);
- killed while the archive was written (only a hidden temporary file beside it): the release
  is finished, so only its archive is written, from the finished folder (same bytes as an
  uninterrupted run: the archive is a function of the folder).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from quantbench.errors import ParameterError
from quantbench.fsutil import check_new_file
from quantbench.release.archive import SUFFIX, default_path, write_archive
from quantbench.release.record import ReleaseResult, build_release, registry_lock, release_state, releases_dir
from quantbench.release.verify import load_record


def publish_release(tag: str, *, results_dir: str | os.PathLike = "results", hosts=None, retain: bool = True,
                    variants=None, archive: str | os.PathLike | None = None, force: bool = False) -> ReleaseResult:
    """build_release, then (`archive` not None; "" for the default path) its archive: res.archive = (path, sha256).

    A file already at the archive's path is an error (nothing written) unless `force`. A finished release whose
    archive is missing (an interrupted `--archive`), or with `force`, gets its archive only."""
    rdir = releases_dir(results_dir)
    dest = rdir / tag
    out = _archive_path(dest, archive)
    if out is not None:
        check_new_file(out, "archive", force, folder_made=not str(archive))  # the default's: the releases folder
    if out is not None and release_state(rdir, tag) == "finished" and (force or not out.exists()):
        res = ReleaseResult(tag, dest, load_record(dest))
        res.notes.append(f"release {tag} was already finished; wrote its "
                         f"{'archive again' if out.exists() else 'missing archive'}")
    else:
        res = build_release(tag, results_dir=results_dir, hosts=hosts, retain=retain, variants=variants)
        if res.refused or out is None:
            return res
    with registry_lock(rdir):
        _remove_partial(out)
        res.archive = write_archive(dest, out)
    return res


def _archive_path(dest: Path, archive) -> Path | None:
    if archive is None:
        return None
    out = Path(archive) if str(archive) else default_path(dest)
    if not str(out).endswith(SUFFIX):
        raise ParameterError("archive", f"must end in {SUFFIX} (the archive is a gzip-compressed tar)", str(out))
    return out


def _remove_partial(out: Path) -> None:
    """The hidden temporary files a killed archive writer left beside `out` (the registry lock is held:
    no live writer has one open)."""
    for p in out.parent.glob(f".{out.name}.*.tmp"):
        with contextlib.suppress(OSError):
            p.unlink()
