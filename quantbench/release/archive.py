"""One-file releases: `quantbench release --archive` and `quantbench verify ARCHIVE`.

The archive is a gzip-compressed tar (standard library only) holding, under one
top folder named after the tag:

- ``manifest.json`` (always the first member): every other member's path, size and
  SHA-256, which release artifact each deduplicated model stands for, and the
  registry entries that vouched for the release when it was archived;
- ``release.json``, ``report.md`` and its images, the Parquet tables and the
  calibration manifests, exactly as in the release folder;
- ``models/<raw sha256>.onnx``: each retained variant model once, however many
  variants share its bytes (the record's ``artifacts/<name>.onnx`` points at it).

The bytes are deterministic: members sorted, mtime 0, uid/gid 0, no user or group
names, mode 0644, the gzip header without a name or a time. The same release
folder gives the same archive, byte for byte (the record's own `created_at`
timestamps are the only inputs that differ between two releases of the same run).

`verify_archive` never trusts the tar: it decompresses the whole stream first (the
gzip CRC covers every byte, the header is compared with the one quantbench writes),
accepts only regular files with plain relative names inside the top folder (no
absolute path, no `..`, no link, no device, no duplicate), re-hashes every member
against the manifest, writes them itself (never `tarfile.extract`) into a private
temporary folder, and then runs the same checks as `verify FOLDER` there.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

from quantbench.errors import GateFailed, ParameterError, UserError
from quantbench.fsutil import atomic_path, sha256_file
from quantbench.release.record import INDEX_FILE, RELEASE_FILE, load_registry
from quantbench.release.verify import FAIL, PASS, Check, load_record, verify

ARCHIVE_FORMAT = 1
MANIFEST = "manifest.json"
SUFFIX = ".tar.gz"
GZIP_LEVEL = 9
MAX_MEMBERS = 100_000
MAX_MEMBER_BYTES = 8 << 30
_NAME_RE = re.compile(r"^[A-Za-z0-9._+-]+$")


def default_path(folder: Path) -> Path:
    """results/releases/<tag>.tar.gz beside the release folder."""
    return folder.parent / f"{folder.name}{SUFFIX}"


def _gzip_header() -> bytes:
    """The 10-byte gzip header this module writes (no file name, mtime 0)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=GZIP_LEVEL, mtime=0):
        pass
    return buf.getvalue()[:10]


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.type = size, 0, 0o644, tarfile.REGTYPE
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def _members(folder: Path, rec: dict) -> tuple[list[tuple[str, Path]], dict]:
    """(archive path, source file) for every file of the release, models deduplicated by raw hash."""
    artifacts = {}
    for v in rec["variants"]:
        a = v.get("artifact") or {}
        if a.get("retained") and a.get("file"):
            artifacts[a["file"]] = f"models/{v['raw_sha256']}.onnx"
    out, seen = [], set()
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            raise UserError(f"{p}: a symbolic link inside the release folder; refusing to archive it")
        if not p.is_file():
            continue
        rel = p.relative_to(folder).as_posix()
        if any(part.startswith(".") for part in PurePosixPath(rel).parts):
            continue  # staging leftovers, lock files
        if rel in artifacts:
            rel = artifacts[rel]
            if rel in seen:
                continue
        seen.add(rel)
        out.append((rel, p))
    if RELEASE_FILE not in seen:
        raise UserError(f"{folder}: no {RELEASE_FILE}; not a release folder")
    return sorted(out), artifacts


def write_archive(folder: str | os.PathLike, out: str | os.PathLike | None = None) -> tuple[Path, str]:
    """Write the release folder as one deterministic .tar.gz; returns (path, its SHA-256)."""
    folder = Path(folder)
    rec = load_record(folder)
    tag = rec.get("tag") or folder.name
    out = Path(out) if out else default_path(folder)
    if not str(out).endswith(SUFFIX):
        raise ParameterError("out", f"must end in {SUFFIX} (the archive is a gzip-compressed tar)", str(out))
    members, artifacts = _members(folder, rec)
    registry = {}
    if (folder.parent / INDEX_FILE).exists():
        reg = load_registry(folder.parent)
        keys = {t["release_key"] for v in rec["variants"] for t in v["targets"]}
        registry = {"releases": {tag: (reg.get("releases") or {}).get(tag, {})},
                    "keys": {k: reg["keys"][k] for k in sorted(keys) if k in reg["keys"]}}
    manifest = {
        "format": ARCHIVE_FORMAT, "tag": tag,
        "members": [{"path": rel, "size": p.stat().st_size, "sha256": sha256_file(p)} for rel, p in members],
        "artifacts": dict(sorted(artifacts.items())),
        "registry": registry,
    }
    data = (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode("utf-8")
    with atomic_path(out) as tmp:
        with open(tmp, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(_tarinfo(f"{tag}/{MANIFEST}", len(data)), io.BytesIO(data))
            for rel, p in members:
                with open(p, "rb") as fh:
                    tar.addfile(_tarinfo(f"{tag}/{rel}", p.stat().st_size), fh)
    return out, sha256_file(out)


# --- verify -------------------------------------------------------------------

class ArchiveDamaged(Exception):
    pass


def _stream_check(path: Path) -> None:
    """Decompress the whole file (gzip CRC and length over every byte) and compare the header."""
    with open(path, "rb") as fh:
        head = fh.read(10)
    if head[:2] != b"\x1f\x8b":
        raise ArchiveDamaged("not a gzip file")
    if head != _gzip_header():
        raise ArchiveDamaged("gzip header differs from the one quantbench writes (modified)")
    try:
        with gzip.open(path, "rb") as gz:
            while gz.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error) as exc:
        raise ArchiveDamaged(f"compressed data damaged ({exc})") from None


def _safe_rel(name: str, tag: str) -> str:
    """The member's path inside the top folder, or ArchiveDamaged for anything that could escape."""
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise ArchiveDamaged(f"member {name!r}: absolute or unusual path")
    parts = PurePosixPath(name).parts
    if ".." in parts or "." in parts or len(parts) < 2 or parts[0] != tag:
        raise ArchiveDamaged(f"member {name!r}: not a plain path inside {tag}/")
    if not all(_NAME_RE.fullmatch(p) and not p.startswith(".") for p in parts):
        raise ArchiveDamaged(f"member {name!r}: path parts must be plain names ([A-Za-z0-9._+-], no leading '.')")
    return "/".join(parts[1:])


def _read_members(path: Path, dest: Path) -> tuple[dict, dict]:
    """Stream the tar: check every member's type and name, write it under dest, hash it.

    Returns (manifest, {rel: (size, sha256)}) for every member after the manifest.
    """
    got, manifest, tag = {}, None, None
    try:
        with tarfile.open(path, mode="r|gz") as tar:
            for i, m in enumerate(tar):
                if i > MAX_MEMBERS:
                    raise ArchiveDamaged(f"more than {MAX_MEMBERS} members")
                if not m.isreg():
                    kind = "link" if (m.issym() or m.islnk()) else "directory" if m.isdir() else "special file"
                    raise ArchiveDamaged(f"member {m.name!r} is a {kind}; only regular files are accepted")
                if m.size > MAX_MEMBER_BYTES:
                    raise ArchiveDamaged(f"member {m.name!r}: {m.size} bytes exceeds the {MAX_MEMBER_BYTES} cap")
                if i == 0:
                    tag = PurePosixPath(m.name).parts[0] if m.name else ""
                    if not _NAME_RE.fullmatch(tag or "") or m.name != f"{tag}/{MANIFEST}":
                        raise ArchiveDamaged(f"first member is {m.name!r}, not <tag>/{MANIFEST}")
                    try:
                        manifest = json.loads(tar.extractfile(m).read(64 << 20))
                    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                        raise ArchiveDamaged(f"{MANIFEST}: not JSON ({exc})") from None
                    continue
                rel = _safe_rel(m.name, tag)
                if rel in got or rel == MANIFEST:
                    raise ArchiveDamaged(f"member {m.name!r} appears twice")
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                h, n = hashlib.sha256(), 0
                src = tar.extractfile(m)
                with open(target, "xb") as fh:
                    while block := src.read(1 << 20):
                        h.update(block)
                        n += len(block)
                        fh.write(block)
                got[rel] = (n, h.hexdigest())
    except tarfile.TarError as exc:
        raise ArchiveDamaged(f"not a readable tar ({exc})") from None
    if manifest is None:
        raise ArchiveDamaged("empty archive")
    if not (isinstance(manifest, dict) and manifest.get("format") == ARCHIVE_FORMAT
            and manifest.get("tag") == tag and isinstance(manifest.get("members"), list)
            and isinstance(manifest.get("artifacts", {}), dict) and isinstance(manifest.get("registry", {}), dict)
            and all(isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("sha256"), str)
                    for e in manifest["members"])):
        raise ArchiveDamaged(f"{MANIFEST}: not a quantbench archive manifest of format {ARCHIVE_FORMAT}")
    return manifest, got


def verify_archive(path: str | os.PathLike, host: str | None = None, sample: int = 4, hosts_file=None,
                   registry: bool = True):
    """Checks of an archive (member by member), then `verify` of its contents in a private temp folder."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such release archive")
    checks = []
    with tempfile.TemporaryDirectory(prefix="qb-archive-") as td:
        work = Path(td) / "releases"
        work.mkdir()
        stage = Path(td) / "members"
        stage.mkdir()
        try:
            _stream_check(path)
            manifest, got = _read_members(path, stage)
        except ArchiveDamaged as exc:
            return [Check("archive", path.name, FAIL, str(exc))]
        checks.append(Check("archive", path.name, PASS, f"gzip stream intact, {len(got)} members, SHA-256 "
                                                        f"{sha256_file(path)[:16]}"))
        listed = {}
        for e in manifest["members"]:
            listed[e["path"]] = e
        bad = []
        for rel in sorted(set(listed) | set(got)):
            if rel not in got:
                bad.append(Check("archive member", rel, FAIL, "listed in the manifest, missing from the archive"))
            elif rel not in listed:
                bad.append(Check("archive member", rel, FAIL, "not in the manifest (added after archiving)"))
            elif got[rel] != (listed[rel].get("size"), listed[rel]["sha256"]):
                bad.append(Check("archive member", rel, FAIL, f"SHA-256 {got[rel][1][:16]} != manifest "
                                                              f"{listed[rel]['sha256'][:16]} (modified)"))
        checks += bad or [Check("archive member", f"{len(got)} members", PASS, "every member re-hashes to the manifest")]
        folder = work / manifest["tag"]
        os.replace(stage, folder)
        for file, model in manifest.get("artifacts", {}).items():  # models/<sha>.onnx -> artifacts/<name>.onnx
            rel_ok = isinstance(file, str) and isinstance(model, str)
            src = folder / model if rel_ok and model in got else None
            try:
                dst = folder / _safe_rel(f"{manifest['tag']}/{file}", manifest["tag"]) if rel_ok else None
            except ArchiveDamaged:
                dst = None
            if src is None or dst is None or dst.exists():
                checks.append(Check("archive member", str(file), FAIL, f"artifact mapping {file!r} -> {model!r} is "
                                                                       "not to a model member of the archive"))
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(src, "rb") as a, open(dst, "xb") as b:
                while block := a.read(1 << 20):
                    b.write(block)
        reg = manifest.get("registry") or {}
        if registry and reg:
            (work / INDEX_FILE).write_text(json.dumps({"format": 1, **reg}))
        elif registry:
            checks.append(Check("registry", MANIFEST, FAIL, "the archive carries no registry entries (for a release "
                                                            "archived without its registry, pass --no-registry)"))
            registry = False

        try:
            checks += verify(folder, host=host, sample=sample, hosts_file=hosts_file, registry=registry)
        except (UserError, GateFailed) as exc:
            checks.append(Check("record", "release.json", FAIL, str(exc)))
        for c in checks:  # name paths as they are in the archive, not in the private temp folder
            c.item = c.item.replace(str(work / INDEX_FILE), f"{manifest['tag']}/{MANIFEST} (registry)")
    return checks
