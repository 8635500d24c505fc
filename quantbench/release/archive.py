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

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from quantbench.errors import GateFailed, ParameterError, UserError, flag_mark
from quantbench.fsutil import MAX_EXPANSION, atomic_path, expansion_limit, kill_point, sha256_file, stale_tmp
from quantbench.release.record import INDEX_FILE, RELEASE_FILE, TAG_RE, load_registry
from quantbench.release.verify import FAIL, PASS, Check, load_record, named_files, scratch_folder, verify

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


def _sweep_killed_archives(folder: Path) -> None:
    """Remove the temporary archives (`.<tag>.tar.gz.<pid>@<host>....tmp`) of archive writers that were killed
    (their process gone; fsutil.stale_tmp): any tag's, not only this one's, so a later release clears them."""
    for p in stale_tmp(folder):
        if SUFFIX + "." in p.name and p.is_file():
            p.unlink(missing_ok=True)


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
    _sweep_killed_archives(out.parent)
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


class _Inflated:
    """The decompressed bytes of a one-member gzip file, as a file object tarfile streams from.

    Reads with zlib (one gzip member: Python's gzip module would go on into a second member appended after the
    first), so what follows the end of the stream, in the file or as another gzip member, is found: ArchiveDamaged.
    No more than `limit` bytes come out (set once the manifest says what the members take up as a tar), and
    `last_data` is one past the last non-zero byte, so zeros alone may follow the tar's last member."""

    def __init__(self, path: Path, limit: int = MAX_MANIFEST_BYTES + 2 * _HEADER_BYTES + tarfile.RECORDSIZE):
        self.fh, self.limit, self.total, self.last_data = open(path, "rb"), limit, 0, 0
        self.z, self.pending = zlib.decompressobj(wbits=31), b""

    def read(self, n: int = -1) -> bytes:
        n = 1 << 20 if n is None or n < 0 else n
        while len(self.pending) < n and not self.z.eof:
            self._inflate(n - len(self.pending))
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def _inflate(self, want: int) -> None:
        try:
            raw = self.z.unconsumed_tail or self.fh.read(1 << 16)
            if not raw:
                raise ArchiveDamaged("compressed data damaged (the gzip stream ends early: truncated)")
            block = self.z.decompress(raw, max(want, 1 << 16))
        except zlib.error as exc:
            raise ArchiveDamaged(f"compressed data damaged ({exc})") from None
        if block.strip(b"\0"):
            self.last_data = self.total + len(block.rstrip(b"\0"))
        self.total += len(block)
        if self.total > self.limit:
            raise ArchiveDamaged(f"decompresses to more than the {self.limit} bytes its manifest accounts for")
        self.pending += block
        if self.z.eof and (self.z.unused_data or self.fh.read(1)):
            raise ArchiveDamaged("data after the end of the gzip stream (appended after archiving)")

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def close(self) -> None:
        self.fh.close()


def _tar_stream(path: Path):
    """(the inflated stream, tarfile reading it member by member)."""
    raw = _Inflated(path)
    try:
        return raw, tarfile.open(fileobj=raw, mode="r|")
    except tarfile.TarError as exc:
        raw.close()
        raise ArchiveDamaged(f"not a readable tar ({exc})") from None


def _check_end(raw: _Inflated, tar) -> None:
    """After the tar's last member: nothing but its end blocks, padded as tarfile writes them."""
    raw.drain()
    want = -(-(tar.offset + 2 * tarfile.BLOCKSIZE) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE
    if raw.last_data > tar.offset or raw.total != want:
        raise ArchiveDamaged(f"data after the end of the tar ({raw.total - tar.offset} bytes after its last member, "
                             f"{want - tar.offset} expected)")


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


def _walk(path: Path, take) -> dict:
    """Stream the tar: check every member's type, name and size against the manifest and call
    `take(rel, file object, size)` for it. Stops at the first member the manifest does not list at that size, so
    no more than the manifest declares is ever read; after the last member, nothing but the tar's end blocks and
    the end of the one gzip stream. Returns the manifest."""
    raw, tar = _tar_stream(path)
    manifest, tag, listed, seen = None, None, {}, set()
    try:
        with tar:
            for i, m in enumerate(tar):
                if i == 0:
                    tag, manifest, listed = _read_manifest(tar, m)
                    _check_declared(path, listed)
                    raw.limit = _tar_bound([*listed.values(), m.size])
                    continue
                rel = _listed_member(m, tag, listed, seen)
                take(rel, tar.extractfile(m), m.size)
            if manifest is None:
                raise ArchiveDamaged("empty archive")
            _check_end(raw, tar)
    except tarfile.TarError as exc:
        raise ArchiveDamaged(f"not a readable tar ({exc})") from None
    finally:
        raw.close()
    return manifest


def _listed_member(m, tag: str, listed: dict, seen: set) -> str:
    """The member's path inside the top folder, once it is a regular file the manifest lists at its size."""
    if not m.isreg():
        kind = "link" if (m.issym() or m.islnk()) else "directory" if m.isdir() else "special file"
        raise ArchiveDamaged(f"member {m.name[:80]!r} is a {kind}; only regular files are accepted")
    rel = _safe_rel(m.name, tag)
    if rel in seen or rel == MANIFEST:
        raise ArchiveDamaged(f"member {m.name!r} appears twice")
    if rel not in listed:
        raise ArchiveDamaged(f"member {m.name!r} is not in the manifest (added after archiving)")
    if m.size != listed[rel]:
        raise ArchiveDamaged(f"member {m.name!r}: {m.size} bytes in the tar, the manifest says "
                             f"{listed[rel]} (modified); nothing after it was read")
    seen.add(rel)
    return rel


def _survey(path: Path) -> dict:
    """A first pass that writes nothing: the stream and every member's header checked, release.json read, and
    every member the manifest lists checked to be one release.json names (or a model it stands for): a member only
    the manifest lists (it is not sealed) is refused before anything is unpacked. Returns the manifest."""
    record = []

    def take(rel, src, size):
        if rel == RELEASE_FILE:
            if size > MAX_MANIFEST_BYTES:
                raise ArchiveDamaged(f"{RELEASE_FILE}: {size} bytes exceeds the {MAX_MANIFEST_BYTES} cap")
            record.append(src.read(size))

    manifest = _walk(path, take)
    try:
        named = named_files(json.loads(record[0])) if record else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        named = None
    if named is None:
        raise ArchiveDamaged(f"{manifest['tag']}/{RELEASE_FILE}: missing, or not a release record")
    models = {m for m in manifest.get("artifacts", {}).values() if isinstance(m, str)}
    extra = sorted(e["path"] for e in manifest["members"] if e["path"] not in named | models)
    if extra:
        raise ArchiveDamaged(f"{len(extra)} member(s) that {RELEASE_FILE} does not name (first: {manifest['tag']}/"
                             f"{extra[0]}): listed only in {MANIFEST}, added after release; nothing was unpacked")
    return manifest


def _read_members(path: Path, dest: Path) -> tuple[dict, dict]:
    """After _survey: every member written under dest and hashed. Returns (manifest, {rel: (size, sha256)}) for
    every member after the manifest."""
    _survey(path)
    got = {}

    def take(rel, src, size):
        got[rel] = _write_member(src, dest / rel, size)
        kill_point("archive-member")

    return _walk(path, take), got


def _check_declared(path: Path, listed: dict) -> None:
    """The members' declared sizes, all together, fit what the archive can hold (MAX_EXPANSION), before any is read."""
    declared, size = sum(listed.values()), path.stat().st_size
    if declared > expansion_limit(size):
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
        _drop_models(folder, manifest)
        reg = manifest.get("registry") or {}
        if registry and reg:
            (work / INDEX_FILE).write_text(json.dumps({"format": 1, **reg}))
        elif registry:
            checks.append(Check("registry", MANIFEST, FAIL, "the archive carries no registry entries (for a release "
                                                            f"archived without its registry, pass {flag_mark('no_registry')})"))
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


def _drop_models(folder: Path, manifest: dict) -> None:
    """The models/<sha>.onnx members, once copied to the artifacts they stand for (the record names those, and
    `verify` of the folder refuses any file the record does not name)."""
    try:   # (read by _survey already; a malformed record is verify's FAIL, below)
        named = named_files(json.loads((folder / RELEASE_FILE).read_bytes())) or set()
    except (OSError, ValueError):
        named = set()
    for model in set(manifest.get("artifacts", {}).values()) - named:
        p = folder / model
        if p.is_file():
            p.unlink()
    with contextlib.suppress(OSError):
        (folder / "models").rmdir()
