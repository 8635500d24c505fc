"""What release and verify meet that is damaged or out of place: a bit-flipped table part is refused by release
in one line (it was released and verified PASS, then `equiv` and `report` died on a UnicodeDecodeError); a
releases folder linked out of the results folder is refused; verify names a FIFO for what it is, refuses
`--sample` without `--host`, finds the registry of a release reached through a link, and fails an extra folder."""

from __future__ import annotations

import os
import shutil

import pyarrow.parquet as pq
import pytest

from cli_helpers import digest, one_line
from quantbench.cli import main
from quantbench.store import partread

from release_helpers import release


def _flip_in_strings(part) -> None:
    """One byte of a string value made invalid UTF-8 (0x8b), in place: the part still parses, its footer is
    intact, and the value is only wrong when decoded (as a bad disk or a bad copy leaves it)."""
    data = bytearray(part.read_bytes())
    t = pq.read_table(part)
    value = next(v for c in t.column_names if str(t.schema.field(c).type) == "string"
                 for v in t.column(c).to_pylist() if v and len(v) > 6 and v.encode() in data)
    at = bytes(data).index(value.encode()) + 3
    data[at] = 0x8B
    part.write_bytes(bytes(data))
    partread._PART_FOOTERS.clear()


def _uncompressed_outputs(results) -> None:
    """The outputs table rewritten as one uncompressed part (so a byte of a string is a byte of the file)."""
    tdir = results / "tables" / "outputs"
    parts = sorted(tdir.glob("part-*.parquet"))
    t = partread.read("outputs", results / "tables")
    for p in parts:
        p.unlink()
    pq.write_table(t, tdir / "part-0000damaged.parquet", compression="none", write_statistics=False)


def test_release_refuses_a_bit_flipped_part(results, capsys):
    _uncompressed_outputs(results)
    part = results / "tables" / "outputs" / "part-0000damaged.parquet"
    _flip_in_strings(part)
    before = digest(results)
    assert release(results, "bf", "--archive") == 2
    line = one_line(capsys.readouterr().err, "release")
    assert f"{part}: damaged outputs table part (ArrowInvalid: " in line and "UTF8" in line.upper(), line
    assert digest(results) == before and not (results / "releases" / "bf").exists()
    assert main(["report", "--results", str(results)]) == 2
    assert "damaged outputs table part" in one_line(capsys.readouterr().err, "report")


def test_a_releases_link_out_of_the_results_folder_is_refused(results, tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (results / "releases").symlink_to(outside)
    assert release(results, "v1", "--archive") == 2
    line = one_line(capsys.readouterr().err, "release")
    assert f"{results}/releases: is a symbolic link out of {results} (to {outside})" in line
    assert list(outside.iterdir()) == []


@pytest.fixture
def released(results, capsys):
    assert release(results, "v1") == 0
    capsys.readouterr()
    return results / "releases" / "v1"


def test_verify_names_a_fifo(results, tmp_path, capsys):
    fifo = tmp_path / "v1.fifo"
    os.mkfifo(fifo)
    assert main(["verify", str(fifo)]) == 2
    assert f"{fifo}: is a named pipe (FIFO), expected a release folder or archive" in one_line(
        capsys.readouterr().err, "verify")


def test_verify_refuses_sample_without_host(released, capsys):
    assert main(["verify", str(released), "--sample", "2"]) == 2
    line = one_line(capsys.readouterr().err, "verify")
    assert "--sample 2: re-runs fixtures on --host, and no --host was given" in line


def test_verify_through_a_link_finds_the_registry(released, tmp_path, capsys):
    link = tmp_path / "linked-v1"
    link.symlink_to(released)
    assert main(["verify", str(link)]) == 0
    assert "PASS" in capsys.readouterr().out


def test_an_extra_empty_folder_fails_verify(released, capsys):
    (released / "extra").mkdir()
    assert main(["verify", str(released)]) == 1
    out = capsys.readouterr().out
    assert any(" FAIL " in ln and "extra/" in ln and "not named by release.json" in ln for ln in out.splitlines()), out
    shutil.rmtree(released / "extra")
    assert main(["verify", str(released)]) == 0


def test_release_names_a_fifo_part_without_blocking(results, capsys):
    fifo = results / "tables" / "outputs" / "part-fifo.parquet"
    os.mkfifo(fifo)
    before = digest(results)
    assert release(results, "v1", "--archive") == 2
    line = one_line(capsys.readouterr().err, "release")
    assert f"{fifo}: damaged outputs table part (NotAPart: is a named pipe (FIFO), not a Parquet file)" in line, line
    assert digest(results) == before and not (results / "releases" / "v1").exists()
