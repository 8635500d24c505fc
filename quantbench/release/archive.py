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
folder gives the same archive, byte for byte; two releases of the same results differ
only in the record's `created_at`, which SOURCE_DATE_EPOCH fixes (record.release_time).

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
import zlib
from pathlib import Path, PurePosixPath

from quantbench.errors import GateFailed, ParameterError, UserError, flag
from quantbench.fsutil import atomic_path, kill_point, sha256_file
from quantbench.release.record import INDEX_FILE, RELEASE_FILE, TAG_RE, load_registry
from quantbench.release.verify import FAIL, PASS, Check, load_record, scratch_folder, verify

ARCHIVE_FORMAT = 1
MANIFEST = "manifest.json"
SUFFIX = ".tar.gz"
GZIP_LEVEL = 9
MAX_MEMBERS = 100_000
MAX_MEMBER_BYTES = 8 << 30
MAX_MANIFEST_BYTES = 64 << 20
MAX_NAME_CHARS = 200       # one path part (a file system takes 255 bytes)
MAX_PATH_CHARS = 1024      # a whole member name
MAX_DEPTH = 16             # folders below the tag (a release's deepest path has 4)
_HEADER_BYTES = 4 * 512    # a member's tar header with its pax extended header, at most
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
        kill_point("archive-written")
    return out, sha256_file(out)


# --- verify -------------------------------------------------------------------

class ArchiveDamaged(Exception):
    pass


def _check_header(path: Path) -> None:
    """The file starts with the gzip header quantbench writes."""
    with open(path, "rb") as fh:
        head = fh.read(10)
    if head[:2] != b"\x1f\x8b":
        raise ArchiveDamaged("not a gzip file")
    if head != _gzip_header():
        raise ArchiveDamaged("gzip header differs from the one quantbench writes (modified)")


def _stream_check(path: Path, limit: int) -> None:
    """Decompress the whole file (gzip CRC and length over every byte, so nothing hides after the tar).

    Stops once more than `limit` bytes came out (what the manifest's members can take up as a tar):
    a small file that inflates to far more than it declares is refused, not inflated."""
    n = 0
    try:
        with gzip.open(path, "rb") as gz:
            while block := gz.read(1 << 20):
                n += len(block)
                if n > limit:
                    raise ArchiveDamaged(f"decompresses to more than the {limit} bytes its manifest accounts for")
    except (OSError, EOFError, zlib.error) as exc:
        raise ArchiveDamaged(f"compressed data damaged ({exc})") from None


def _tar_bound(sizes) -> int:
    """The most bytes a tar of members of these sizes can decompress to (headers, padding, end blocks)."""
    sizes = list(sizes)
    return sum(-(-n // 512) * 512 + _HEADER_BYTES for n in sizes) + 2 * tarfile.RECORDSIZE


def _safe_rel(name: str, tag: str) -> str:
    """The member's path inside the top folder, or ArchiveDamaged for anything that could escape."""
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise ArchiveDamaged(f"member {name[:80]!r}: absolute or unusual path")
    if len(name) > MAX_PATH_CHARS:
        raise ArchiveDamaged(f"member {name[:80]!r}...: path longer than {MAX_PATH_CHARS} characters")
    parts = PurePosixPath(name).parts
    if ".." in parts or "." in parts or len(parts) < 2 or parts[0] != tag:
        raise ArchiveDamaged(f"member {name!r}: not a plain path inside {tag}/")
    if len(parts) > MAX_DEPTH:
        raise ArchiveDamaged(f"member {name[:80]!r}...: more than {MAX_DEPTH} folders deep")
    if not all(_NAME_RE.fullmatch(p) and not p.startswith(".") and len(p) <= MAX_NAME_CHARS for p in parts):
        raise ArchiveDamaged(f"member {name[:80]!r}: path parts must be plain names ([A-Za-z0-9._+-], no leading "
                             f"'.', at most {MAX_NAME_CHARS} characters)")
    return "/".join(parts[1:])


def _read_manifest(tar, m) -> tuple[str, dict, dict]:
    """(tag, manifest, {path: size} it lists) from the first member, or ArchiveDamaged."""
    tag = PurePosixPath(m.name).parts[0] if m.name else ""
    if not TAG_RE.fullmatch(tag) or m.name != f"{tag}/{MANIFEST}" or not m.isreg():
        raise ArchiveDamaged(f"first member is {m.name[:80]!r}, not <tag>/{MANIFEST} with a release tag")
    if m.size > MAX_MANIFEST_BYTES:
        raise ArchiveDamaged(f"{MANIFEST}: {m.size} bytes exceeds the {MAX_MANIFEST_BYTES} cap")
    try:
        manifest = json.loads(tar.extractfile(m).read(MAX_MANIFEST_BYTES))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArchiveDamaged(f"{MANIFEST}: not JSON ({exc})") from None
    if not (isinstance(manifest, dict) and manifest.get("format") == ARCHIVE_FORMAT
            and manifest.get("tag") == tag and isinstance(manifest.get("members"), list)
            and isinstance(manifest.get("artifacts", {}), dict) and isinstance(manifest.get("registry", {}), dict)
            and all(isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("sha256"), str)
                    and type(e.get("size")) is int and 0 <= e["size"] <= MAX_MEMBER_BYTES
                    for e in manifest["members"])):
        raise ArchiveDamaged(f"{MANIFEST}: not a quantbench archive manifest of format {ARCHIVE_FORMAT}")
    listed = {e["path"]: e["size"] for e in manifest["members"]}
    if len(listed) != len(manifest["members"]) or len(listed) > MAX_MEMBERS:
        raise ArchiveDamaged(f"{MANIFEST}: lists a member twice, or more than {MAX_MEMBERS} members")
    return tag, manifest, listed


def _read_members(path: Path, dest: Path) -> tuple[dict, dict]:
    """Stream the tar: check every member's type, name and size against the manifest, write it under
    dest, hash it. Stops at the first member the manifest does not list at that size, so no more than
    the manifest declares is ever written.

    Returns (manifest, {rel: (size, sha256)}) for every member after the manifest.
    """
    got, manifest, tag, listed, manifest_size = {}, None, None, {}, 0
    try:
        with tarfile.open(path, mode="r|gz") as tar:
            for i, m in enumerate(tar):
                if i == 0:
                    tag, manifest, listed = _read_manifest(tar, m)
                    manifest_size = m.size
                    _check_declared(path, listed)
                    continue
                if not m.isreg():
                    kind = "link" if (m.issym() or m.islnk()) else "directory" if m.isdir() else "special file"
                    raise ArchiveDamaged(f"member {m.name[:80]!r} is a {kind}; only regular files are accepted")
                rel = _safe_rel(m.name, tag)
                if rel in got or rel == MANIFEST:
                    raise ArchiveDamaged(f"member {m.name!r} appears twice")
                if rel not in listed:
                    raise ArchiveDamaged(f"member {m.name!r} is not in the manifest (added after archiving)")
                if m.size != listed[rel]:
                    raise ArchiveDamaged(f"member {m.name!r}: {m.size} bytes in the tar, the manifest says "
                                         f"{listed[rel]} (modified); nothing after it was read")
                got[rel] = _write_member(tar.extractfile(m), dest / rel, m.size)
                kill_point("archive-member")
    except tarfile.TarError as exc:
        raise ArchiveDamaged(f"not a readable tar ({exc})") from None
    if manifest is None:
        raise ArchiveDamaged("empty archive")
    _stream_check(path, _tar_bound([*listed.values(), manifest_size]))
    return manifest, got


#: how many times its own size an archive's members may declare: quantbench's members (models, Parquet, PNG) are
#: compressed already, so a release inflates about 1-2x; a manifest declaring far more is refused before a byte
#: is written (one declaring a 1.5 GiB member of zeros made verify write 1.5 GiB before its hash failed)
MAX_EXPANSION = 64
_EXPANSION_SLACK = 1 << 20


def _check_declared(path: Path, listed: dict) -> None:
    """The members' declared sizes, all together, fit what the archive can hold (MAX_EXPANSION), before any is read."""
    declared, size = sum(listed.values()), path.stat().st_size
    if declared > MAX_EXPANSION * size + _EXPANSION_SLACK:
        raise ArchiveDamaged(f"{MANIFEST}: declares {declared} bytes of members, more than {MAX_EXPANSION} times the "
                             f"{size}-byte archive; nothing was extracted")


def _write_member(src, target: Path, size: int) -> tuple[int, str]:
    """Copy at most `size` bytes of a member to `target` (a new file); (bytes, SHA-256)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    h, n = hashlib.sha256(), 0
    with open(target, "xb") as fh:
        while n < size and (block := src.read(min(1 << 20, size - n))):
            h.update(block)
            n += len(block)
            fh.write(block)
    return n, h.hexdigest()


def verify_archive(path: str | os.PathLike, host: str | None = None, sample: int = 4, hosts_file=None,
                   registry: bool = True, results_dir: str | os.PathLike = "results"):
    """Checks of an archive (member by member), then `verify` of its contents in a private folder.

    The members are unpacked under `results_dir`'s staging area (results/.staging/, a folder named
    after this process: removed when verify ends, and by the next verify if this one is killed)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such release archive")
    with scratch_folder(results_dir, "verify") as td:
        work, stage = td / "releases", td / "members"
        work.mkdir()
        stage.mkdir()
        try:
            _check_header(path)
            manifest, got = _read_members(path, stage)
        except ArchiveDamaged as exc:
            return [Check("archive", path.name, FAIL, str(exc))]
        checks = [Check("archive", path.name, PASS, f"gzip stream intact, {len(got)} members, SHA-256 "
                                                    f"{sha256_file(path)[:16]}")]
        bad = _member_checks(manifest, got)
        checks += bad or [Check("archive member", f"{len(got)} members", PASS, "every member re-hashes to the manifest")]
        if bad:  # a member that failed its hash is never read, let alone parsed
            return checks + [Check("release", manifest["tag"], FAIL, f"not verified further: {len(bad)} member(s) "
                                                                     "differ from the manifest")]
        folder = work / manifest["tag"]
        os.replace(stage, folder)
        checks += _place_artifacts(folder, manifest, got)
        reg = manifest.get("registry") or {}
        if registry and reg:
            (work / INDEX_FILE).write_text(json.dumps({"format": 1, **reg}))
        elif registry:
            checks.append(Check("registry", MANIFEST, FAIL, "the archive carries no registry entries (for a release "
                                                            f"archived without its registry, pass {flag('no_registry')})"))
            registry = False
        try:
            checks += verify(folder, host=host, sample=sample, hosts_file=hosts_file, registry=registry,
                             results_dir=results_dir)
        except (UserError, GateFailed) as exc:
            checks.append(Check("record", "release.json", FAIL, str(exc)))
        for c in checks:  # name paths as they are in the archive, not in the private folder
            c.item = c.item.replace(str(work / INDEX_FILE), f"{manifest['tag']}/{MANIFEST} (registry)")
    return checks


def _member_checks(manifest: dict, got: dict) -> list[Check]:
    """A FAIL per member missing, unlisted or not hashing to the manifest; [] when all match."""
    listed = {e["path"]: e for e in manifest["members"]}
    bad = []
    for rel in sorted(set(listed) | set(got)):
        if rel not in got:
            bad.append(Check("archive member", rel, FAIL, "listed in the manifest, missing from the archive"))
        elif rel not in listed:
            bad.append(Check("archive member", rel, FAIL, "not in the manifest (added after archiving)"))
        elif got[rel] != (listed[rel].get("size"), listed[rel]["sha256"]):
            bad.append(Check("archive member", rel, FAIL, f"SHA-256 {got[rel][1][:16]} != manifest "
                                                          f"{listed[rel]['sha256'][:16]} (modified)"))
    return bad


def _place_artifacts(folder: Path, manifest: dict, got: dict) -> list[Check]:
    """Copy models/<sha>.onnx to the artifacts/<name>.onnx the record names; a FAIL per bad mapping."""
    out = []
    for file, model in manifest.get("artifacts", {}).items():
        rel_ok = isinstance(file, str) and isinstance(model, str)
        src = folder / model if rel_ok and model in got else None
        try:
            dst = folder / _safe_rel(f"{manifest['tag']}/{file}", manifest["tag"]) if rel_ok else None
        except ArchiveDamaged:
            dst = None
        if src is None or dst is None or dst.exists():
            out.append(Check("archive member", str(file), FAIL, f"artifact mapping {file!r} -> {model!r} is "
                                                                "not to a model member of the archive"))
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(src, "rb") as a, open(dst, "xb") as b:
            while block := a.read(1 << 20):
                b.write(block)
    return out
