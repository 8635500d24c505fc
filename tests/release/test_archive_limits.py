"""`quantbench verify ARCHIVE` takes no more from an archive than its manifest declares, never parses a
member that failed its hash, refuses names no file system takes, and leaves nothing behind."""

import json
import os
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from quantbench.cli import main

from release_helpers import release, write_tar

REPO = Path(__file__).resolve().parents[2]


class Zeros:
    """A file object of `n` zero bytes (a tar bomb's member, never held in memory)."""

    def __init__(self, n):
        self.left = n

    def read(self, k=-1):
        k = self.left if k < 0 else min(k, self.left)
        self.left -= k
        return bytes(k)


def _members(archive):
    with tarfile.open(archive) as tar:
        return [(m, tar.extractfile(m).read()) for m in tar.getmembers()]


def _verify_limited(archive, results, tmp_path, fsize):
    """`verify ARCHIVE` in a process that may write no file larger than `fsize` bytes, with its own empty
    system temp folder; (exit code, stdout, stderr)."""
    tmp = tmp_path / "systemp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO))

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    p = subprocess.run([sys.executable, "-m", "quantbench", "verify", str(archive), "--results", str(results)],
                       env=env, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert not list(tmp.iterdir()), "verify wrote into the system temp folder"
    return p.returncode, p.stdout, p.stderr


def _left_behind(results):
    area = results / ".staging"
    return sorted(p.relative_to(results).as_posix() for p in area.rglob("*")) if area.exists() else []


@pytest.fixture
def archived(results, capsys):
    assert release(results, "v1", "--archive") == 0
    capsys.readouterr()
    return results / "releases" / "v1.tar.gz"


def test_a_member_larger_than_the_manifest_says_stops_verify_at_its_header(archived, results, tmp_path):
    """A 64 MiB release.json (the manifest says a few kB) compresses to a small file: verify refuses it at its
    tar header, without writing it (no file over 1 MiB may be written) and without reading further."""
    members = _members(archived)
    bomb = []
    for m, data in members:
        if m.name == "v1/release.json":
            m.size = 64 << 20
            data = Zeros(m.size)
        bomb.append((m, data))
    forged = tmp_path / "bomb.tar.gz"
    write_tar(forged, bomb)
    assert forged.stat().st_size < 1 << 20
    rc, out, err = _verify_limited(forged, results, tmp_path, 1 << 20)
    assert rc == 1 and "Traceback" not in out + err, err
    fails = [ln for ln in out.splitlines() if " FAIL " in ln and not ln.startswith("verify ")]
    assert len(fails) == 1 and fails[0].startswith("archive ")
    assert "'v1/release.json': 67108864 bytes in the tar, the manifest says" in fails[0]
    assert "nothing after it was read" in fails[0]
    assert _left_behind(results) == []


@pytest.mark.parametrize("where", ["second gzip member", "inside the stream"])
def test_a_stream_that_inflates_past_its_manifest_is_refused(archived, results, tmp_path, where):
    """64 MiB of zeros after the tar's end (tar itself never reads them), as a second gzip member (refused where it
    starts) or inside the one gzip stream (the check stops at what the manifest accounts for): never all inflated."""
    members = _members(archived)
    forged = tmp_path / "trailing.tar.gz"
    write_tar(forged, members)
    import gzip
    import zlib

    data = forged.read_bytes()
    if where == "second gzip member":   # (gzip readers inflate concatenated members as one stream)
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        forged.write_bytes(data + b"".join(z.compress(bytes(1 << 20)) for _ in range(64)) + z.flush())
    else:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        tar = gzip.decompress(data)
        body = z.compress(tar) + b"".join(z.compress(bytes(1 << 20)) for _ in range(64)) + z.flush()
        forged.write_bytes(data[:10] + body[10:])
    assert len(gzip.decompress(forged.read_bytes())) > 64 << 20
    rc, out, err = _verify_limited(forged, results, tmp_path, 1 << 20)
    assert rc == 1 and "Traceback" not in out + err, err
    (line,) = [ln for ln in out.splitlines() if " FAIL " in ln and not ln.startswith("verify ")]
    assert line.startswith("archive ")
    assert ("data after the end of the gzip stream" if where == "second gzip member" else
            "decompresses to more than the") in line, line


def test_a_member_that_failed_its_hash_is_never_parsed(archived, capsys, tmp_path):
    """release.json resealed with other bytes of the same size: its hash fails and verify stops there (old
    verify json-loaded it anyway and judged what it said)."""
    out_members = []
    for m, data in _members(archived):
        if m.name == "v1/release.json":
            rec = json.loads(data)
            assert data.count(b'"format": 1,') == 1
            data = data.replace(b'"format": 1,', b'"format": 7,')   # same size, another record
            assert json.loads(data)["format"] == 7 and len(json.dumps(rec)) > 0
        out_members.append((m, data))
    forged = tmp_path / "resealed.tar.gz"
    write_tar(forged, out_members)
    assert main(["verify", str(forged)]) == 1
    out = capsys.readouterr().out
    fails = [ln for ln in out.splitlines() if " FAIL " in ln and not ln.startswith("verify ")]
    assert any(ln.startswith("archive member") and "release.json" in ln for ln in fails)
    assert not any(ln.startswith(("record", "table", "artifact", "registry")) for ln in out.splitlines())
    assert fails[-1].startswith("release ") and "not verified further: 1 member(s) differ from the manifest" in fails[-1]


@pytest.mark.parametrize("bad", ["300-character name", "25-level path", "tag .."])
def test_unusable_names_fail_in_one_line(archived, results, capsys, tmp_path, bad):
    members = _members(archived)
    if bad == "tag ..":
        manifest = json.loads(members[0][1])
        manifest.update(tag="..", members=[], artifacts={}, registry={})
        data = json.dumps(manifest).encode()
        ti = tarfile.TarInfo("../manifest.json")
        ti.size = len(data)
        forged_members = [(ti, data)]
        want = "first member is '../manifest.json', not <tag>/manifest.json with a release tag"
    else:
        name = "v1/" + ("a" * 300 if bad == "300-character name" else "/".join(["d"] * 25) + "/f")
        ti = tarfile.TarInfo(name)
        ti.size = 4
        forged_members = members[:1] + [(ti, b"evil")] + members[1:]
        want = "characters" if bad == "300-character name" else "more than 16 folders deep"
    forged = tmp_path / "names.tar.gz"
    write_tar(forged, forged_members)
    assert main(["verify", str(forged)]) == 1   # (--results: the default, results/ here)
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if " FAIL " in ln and not ln.startswith("verify ")]
    assert line.startswith("archive ") and want in line
    assert _left_behind(results) == []


def test_a_killed_verify_leaves_nothing_the_next_one_does_not_remove(archived, results, tmp_path):
    """SIGKILL while the members are unpacked (the test hook kills verify right after it wrote the first
    member): its staging folder under results/.staging/ is removed by the next verify, and nothing was
    ever written to the system temp folder."""
    tmp = tmp_path / "systemp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO), QUANTBENCH_TEST_KILL_AT="archive-member")
    p = subprocess.run([sys.executable, "-m", "quantbench", "verify", str(archived), "--results", str(results)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == -9
    left = _left_behind(results)
    assert left and all(x.startswith(".staging/.verify.") for x in left)
    assert not list(tmp.iterdir())
    assert main(["verify", str(archived), "--results", str(results)]) == 0
    assert _left_behind(results) == []


def test_a_manifest_declaring_more_than_the_archive_can_hold_is_refused_before_writing(archived, results, tmp_path):
    """The manifest and the member agree on a 64 MiB release.json of zeros (a small file): verify refuses the
    declared size at the manifest, writing none of it (was: the whole member written before its hash failed)."""
    from quantbench.release.archive import MANIFEST

    members, forged_members = _members(archived), []
    for m, data in members:
        if m.name == f"v1/{MANIFEST}":
            manifest = json.loads(data)
            for e in manifest["members"]:
                if e["path"] == "release.json":
                    e["size"] = 64 << 20
            data = json.dumps(manifest).encode()
            m.size = len(data)
        elif m.name == "v1/release.json":
            m.size = 64 << 20
            data = Zeros(m.size)
        forged_members.append((m, data))
    forged = tmp_path / "declared.tar.gz"
    write_tar(forged, forged_members)
    assert forged.stat().st_size < 256 << 10   # 64 MiB declared: over 64 times the archive and its 1 MiB slack
    rc, out, err = _verify_limited(forged, results, tmp_path, 1 << 20)
    assert rc == 1 and "Traceback" not in out + err, err
    (line,) = [ln for ln in out.splitlines() if " FAIL " in ln and not ln.startswith("verify ")]
    assert line.startswith("archive ") and f"{MANIFEST}: declares " in line and "nothing was extracted" in line
    assert _left_behind(results) == []
