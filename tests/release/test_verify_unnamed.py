"""`quantbench verify` fails a release that holds more than release.json names: bytes after the end of the archive
(another gzip member, raw bytes, data after the tar's end blocks), members listed only in the archive's unsealed
manifest (a nested archive, thousands of empty files: refused before anything is unpacked), files dropped into a
release folder. Exit 1, a FAIL row naming what is extra, no traceback, nothing left in the staging area."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile

import pytest

from quantbench.cli import main

from release_helpers import release, write_tar


@pytest.fixture
def archived(results, capsys):
    assert release(results, "v1", "--archive") == 0
    capsys.readouterr()
    return results / "releases" / "v1.tar.gz"


def _verify(capsys, target, results):
    rc = main(["verify", str(target), "--results", str(results)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    area = results / ".staging"
    assert not area.exists() or not any(area.rglob("*")), "left behind in the staging area"
    return rc, [ln for ln in out.splitlines() if " FAIL " in ln]


def test_the_untouched_archive_and_folder_pass(archived, results, capsys):
    assert _verify(capsys, archived, results) == (0, [])
    assert _verify(capsys, results / "releases" / "v1", results) == (0, [])


def test_a_gzip_member_appended_fails(archived, results, capsys):
    subprocess.run(f"echo hello | gzip -n >> {archived}", shell=True, check=True)
    rc, fails = _verify(capsys, archived, results)
    assert rc == 1 and any(ln.startswith("archive ") and "data after the end of the gzip stream" in ln for ln in fails)


@pytest.mark.parametrize("tail", [b"hello\n", b"\0" * 512])
def test_bytes_appended_fail(archived, results, capsys, tail):
    with open(archived, "ab") as fh:
        fh.write(tail)
    rc, fails = _verify(capsys, archived, results)
    assert rc == 1 and any("after the end of the gzip stream" in ln for ln in fails), fails


@pytest.mark.parametrize("tail", [b"hello\n", b"\0" * 20480])
def test_data_after_the_tars_end_fails(archived, results, capsys, tail):
    data = gzip.decompress(archived.read_bytes()) + tail
    with open(archived, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9,
                                                     mtime=0) as gz:
        gz.write(data)
    rc, fails = _verify(capsys, archived, results)
    assert rc == 1 and any("data after the end of the tar" in ln for ln in fails), fails


def _with_listed_members(archived, forged, extra):
    """The archive with `extra` [(rel, bytes)] added as members and listed in its manifest (re-sealed)."""
    with tarfile.open(archived) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    manifest = json.loads(members[0][1])
    manifest["members"] += [{"path": rel, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for rel, b in extra]
    manifest["members"].sort(key=lambda e: e["path"])
    data = (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode()
    members[0][0].size = len(data)
    out = [(members[0][0], data)]
    for rel, b in extra:
        ti = tarfile.TarInfo(f"v1/{rel}")
        ti.size = len(b)
        out.append((ti, b))
    write_tar(forged, out + sorted(members[1:], key=lambda mb: mb[0].name))


def test_a_nested_archive_listed_only_in_the_manifest_fails(archived, results, tmp_path, capsys):
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as t:
        ti = tarfile.TarInfo("run_me.sh")
        ti.size = 9
        t.addfile(ti, io.BytesIO(b"echo hi\n\n"))
    forged = tmp_path / "nested.tar.gz"
    _with_listed_members(archived, forged, [("extra/inner.tar.gz", inner.getvalue())])
    rc, fails = _verify(capsys, forged, results)
    assert rc == 1
    (line,) = [ln for ln in fails if ln.startswith("archive ")]
    assert "1 member(s) that release.json does not name (first: v1/extra/inner.tar.gz)" in line
    assert "nothing was unpacked" in line


def test_thousands_of_empty_members_are_refused_before_any_is_unpacked(archived, results, tmp_path, capsys,
                                                                       monkeypatch):
    forged = tmp_path / "many.tar.gz"
    _with_listed_members(archived, forged, [(f"a/{i:05d}", b"") for i in range(3000)])
    written = []
    from quantbench.release import archive

    real = archive._write_member
    monkeypatch.setattr(archive, "_write_member", lambda *a: written.append(a[1]) or real(*a))
    rc, fails = _verify(capsys, forged, results)
    assert rc == 1 and any("3000 member(s) that release.json does not name (first: v1/a/00000)" in ln for ln in fails)
    assert written == []


@pytest.mark.parametrize("extra", ["run_me.sh", "artifacts/zz.onnx", ".hidden.sh", "tables/outputs/zz.parquet"])
def test_a_file_dropped_into_a_release_folder_fails(results, capsys, extra):
    assert release(results, "v1") == 0
    capsys.readouterr()
    folder = results / "releases" / "v1"
    (folder / extra).parent.mkdir(parents=True, exist_ok=True)
    (folder / extra).write_bytes(b"#!/bin/sh\necho hi\n")
    rc, fails = _verify(capsys, folder, results)
    assert rc == 1 and any(extra in ln and "not named by release.json" in ln for ln in fails), fails


def test_many_dropped_files_are_counted_not_listed(results, capsys):
    assert release(results, "v1") == 0
    capsys.readouterr()
    folder = results / "releases" / "v1"
    for i in range(40):
        (folder / f"junk{i:02d}").write_bytes(b"")
    rc, fails = _verify(capsys, folder, results)
    rows = [ln for ln in fails if ln.startswith("unnamed file")]
    assert rc == 1 and len(rows) == 6 and "35 more" in rows[-1], fails


@pytest.mark.parametrize("record", [b"[]", b'{"variants": "x", "tables": 3}', b"not json"])
def test_a_resealed_record_that_names_nothing_fails_without_a_traceback(archived, results, tmp_path, capsys, record):
    with tarfile.open(archived) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    manifest = json.loads(members[0][1])
    for e in manifest["members"]:
        if e["path"] == "release.json":
            e.update(size=len(record), sha256=hashlib.sha256(record).hexdigest())
    data = (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode()
    members[0][0].size = len(data)
    out = [(members[0][0], data)]
    for m, b in members[1:]:
        if m.name == "v1/release.json":
            m.size, b = len(record), record
        out.append((m, b))
    forged = tmp_path / "record.tar.gz"
    write_tar(forged, out)
    rc, fails = _verify(capsys, forged, results)
    assert rc == 1 and any(ln.startswith("archive ") and "release.json" in ln for ln in fails), fails
