"""An export damaged in transit is refused before a byte of it is merged: each table member carries its SHA-256 in
the manifest (checked before the member is parsed), and nothing may follow the tar's end blocks (5000 junk bytes,
or a second tar holding a script, were read past without a word)."""

from __future__ import annotations

import io
import shutil
import tarfile

import pytest

from cli_helpers import digest, one_line
from hosts_helpers import image_model, make_corpus
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.hosts import imported


@pytest.fixture
def exported(workdir, capsys):
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=2)
    common = ["--variants", str(model), "--fixtures", str(labels), "--no-progress", "--jobs", "1"]
    assert main(["run", "--hosts", "local", "--results", "a", "--export", "pi.qbr", *common]) == 0
    capsys.readouterr()
    (workdir / "hosts.toml").write_text('airgap = { kind = "imported", file = "pi.qbr" }\n')
    return ["run", "--hosts", "airgap", "--results", "b", "--hosts-file", "hosts.toml", *common]


def _refused(workdir, argv, capsys, words: str) -> str:
    before = digest(workdir)
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err, "run")
    assert line.startswith("quantbench run: error: host airgap: ") and words in line, line
    assert "nothing was imported" in line
    assert digest(workdir) == before and not (workdir / "b").exists()
    return line


def _member_offsets(path) -> dict:
    with tarfile.open(path) as tar:
        return {m.name: (m.offset_data, m.size) for m in tar.getmembers()}


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def test_the_manifest_records_each_tables_sha256(workdir, exported):
    import hashlib
    import json

    with tarfile.open(workdir / "pi.qbr") as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        got = {m.name: hashlib.sha256(tar.extractfile(m).read()).hexdigest() for m in tar.getmembers()
               if m.name != "manifest.json"}
    assert manifest["sha256"] == got and sorted(got) == [f"{t}.parquet" for t in sorted(imported.TABLES)]


@pytest.mark.parametrize("member, where", [("outputs.parquet", 0), ("fixtures.parquet", 0),
                                           ("hosts.parquet", -1), ("models.parquet", "middle")])
def test_a_flipped_byte_in_a_table_is_refused(workdir, exported, capsys, member, where):
    start, size = _member_offsets(workdir / "pi.qbr")[member]
    _flip(workdir / "pi.qbr", start + {0: 0, -1: size - 1, "middle": size // 2}[where])   # 0 / -1: the PAR1 magic
    _refused(workdir, exported, capsys, f"pi.qbr: {member} does not have the SHA-256 its manifest records")


@pytest.mark.parametrize("tail", ["junk", "tar"])
def test_data_after_the_exports_end_is_refused(workdir, exported, capsys, tail):
    path = workdir / "pi.qbr"
    if tail == "junk":
        extra = bytes(range(256)) * 19 + b"x" * 136   # 5000 bytes
    else:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("evil.sh")
            info.size, script = 10, b"rm -rf ~\n\n"
            tar.addfile(info, io.BytesIO(script))
        extra = buf.getvalue()
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + extra)
    line = _refused(workdir, exported, capsys, "pi.qbr: data after the end of the export (")
    assert f"{size + len(extra) - _end(path, size)} bytes after its last member" in line


def _end(path, size: int) -> int:
    """Where the export's end blocks start (the end of its last member, padded to 512 bytes)."""
    start, n = max(_member_offsets(path).values())
    return start + -(-n // 512) * 512


def test_a_nonzero_byte_in_the_end_blocks_is_refused(workdir, exported, capsys):
    path = workdir / "pi.qbr"
    _flip(path, _end(path, path.stat().st_size) + 700)
    _refused(workdir, exported, capsys, "pi.qbr: data after the end of the export")


def test_one_flipped_byte_anywhere_is_refused_or_changes_nothing_merged(workdir, exported):
    """Was: 23 of 80 random flips imported, 4 of them changing what was merged (an image hash, a source name, a
    recipe no longer JSON). Now a flip either is refused or leaves every table as exported (a flip in the padding,
    or in the manifest's layout, which no check reads)."""
    src = workdir / "pi.qbr"
    _, want = imported.read_export(src)
    size = src.stat().st_size
    end = _end(src, size)
    for k, offset in enumerate(range(0, end, max(1, end // 90))):
        copy = workdir / f"flip{k}.qbr"
        shutil.copyfile(src, copy)
        _flip(copy, offset)
        try:
            _, got = imported.read_export(copy)
        except UserError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"{copy}: "), exc
            continue
        assert {n: t.to_pylist() for n, t in got.items()} == {n: t.to_pylist() for n, t in want.items()}, offset
