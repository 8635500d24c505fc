"""An export file holds exactly what `run --export` writes (manifest.json and four Parquet tables, each once,
each a regular file): anything else arriving from elsewhere is refused, naming it, and nothing is imported."""

import io
import os
import tarfile

import pytest

from hosts_helpers import image_model, make_corpus, reseal_export
from quantbench.cli import main


@pytest.fixture
def exported(workdir, capsys):
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=1)
    common = ["--variants", str(model), "--fixtures", str(labels), "--no-progress", "--jobs", "1"]
    assert main(["run", "--hosts", "local", "--results", "a", "--export", "pi.qbr", *common]) == 0
    capsys.readouterr()
    (workdir / "hosts.toml").write_text('airgap = { kind = "imported", file = "pi.qbr" }\n')
    return ["run", "--hosts", "airgap", "--results", "b", "--hosts-file", "hosts.toml", *common]


def _rewrite(path, extra):
    """The export with `extra(tar)` members appended."""
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for m, data in members:
            tar.addfile(m, io.BytesIO(data))
        extra(tar)


def _file(tar, name, data=b"payload"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _link(tar, name):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    tar.addfile(info)


CASES = {
    "extra file": (lambda t: _file(t, "notes/evil.py"), "member(s) quantbench does not write: notes/evil.py"),
    "duplicate": (lambda t: _file(t, "outputs.parquet"), "member outputs.parquet appears more than once"),
    "link": (lambda t: _link(t, "readme"), "member readme is not a regular file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unexpected_members_refused(workdir, exported, capsys, case):
    add, words = CASES[case]
    _rewrite(workdir / "pi.qbr", add)
    assert main(exported) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("quantbench run: error: host airgap: ") and f"pi.qbr: {words}" in err, err
    assert "nothing was imported" in err
    assert not (workdir / "b").exists()  # nothing written


def test_plain_export_still_imports(workdir, exported, capsys):
    assert main(exported) == 0
    assert os.path.isdir(workdir / "b")


def _replace_member(path, name, data):
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for m, old in members:
            if m.name == name:
                m.size, old = len(data), data
            tar.addfile(m, io.BytesIO(old))
    reseal_export(path)


def test_rows_repeated_past_the_manifest_are_refused_before_they_are_read(workdir, exported, capsys):
    """The outputs rows repeated 1000 times compress to a small file (100,000 times decoded to 3.5 GB): the
    Parquet footer's row count is checked against the manifest's before a row is read."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    with tarfile.open(workdir / "pi.qbr") as tar:
        outputs = pq.read_table(io.BytesIO(tar.extractfile("outputs.parquet").read()))
        declared = json.loads(tar.extractfile("manifest.json").read())["rows"]["outputs"]
    buf = io.BytesIO()
    pq.write_table(pa.concat_tables([outputs] * 1000), buf, compression="zstd")
    _replace_member(workdir / "pi.qbr", "outputs.parquet", buf.getvalue())
    assert main(exported) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert (f"pi.qbr: outputs.parquet holds {1000 * declared} rows, the manifest declares {declared}; the file was "
            "altered or damaged, nothing was imported") in err
    assert not (workdir / "b").exists()  # nothing written


def _forge_repeated(path, times: int) -> int:
    """outputs.parquet with its rows repeated `times` times and the manifest's row count forged to match (the
    file's other checks all hold: every repeated row hashes as it should); returns the forged count."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    with tarfile.open(path) as tar:
        outputs = pq.read_table(io.BytesIO(tar.extractfile("outputs.parquet").read()))
        manifest = json.loads(tar.extractfile("manifest.json").read())
    buf = io.BytesIO()
    pq.write_table(pa.concat_tables([outputs] * times), buf, compression="zstd")
    manifest["rows"]["outputs"] *= times
    _replace_member(path, "outputs.parquet", buf.getvalue())
    _replace_member(path, "manifest.json", json.dumps(manifest).encode())
    return manifest["rows"]["outputs"]


def _refused(exported, workdir, capsys) -> str:
    assert main(exported) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("quantbench run: error: host airgap: ") and "nothing was imported" in err, err
    assert not (workdir / "b").exists()  # nothing written
    return err


def test_rows_repeated_with_the_manifest_forged_to_match_are_refused(workdir, exported, capsys):
    """The manifest's row count forged together with the table (was: imported, each row re-hashed fine): a row
    that repeats another's key (run key, host, output) is refused, naming both rows."""
    _forge_repeated(workdir / "pi.qbr", 10)
    err = _refused(exported, workdir, capsys)
    assert "pi.qbr: outputs row 1 (host " in err and "repeats row 0 (the same run, host and output)" in err, err


def test_a_table_decoding_to_far_more_than_its_file_is_refused_while_it_is_read(workdir, exported, capsys):
    """100,000 repeats of the rows compress to a small Parquet file whose footer and manifest agree on the count
    (was: all of it decoded, 3.5 GB for a 560 KB file, then imported): reading stops once the decoded table
    passes 64 times the member's size (and 1 MiB), before the rest is decoded."""
    from quantbench.fsutil import MAX_EXPANSION

    _forge_repeated(workdir / "pi.qbr", 100_000)
    with tarfile.open(workdir / "pi.qbr") as tar:
        stored = tar.getmember("outputs.parquet").size
    err = _refused(exported, workdir, capsys)
    assert (f"pi.qbr: outputs.parquet decodes to more than {MAX_EXPANSION} times its {stored} bytes (and 1 MiB); "
            "the file was altered or damaged") in err, err
