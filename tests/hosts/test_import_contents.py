"""An export's tables hold exactly what `run --export` wrote: a column its schema lacks (it was dropped without a
word) or a row count other than the manifest's is refused, naming the file and the table; nothing is imported."""

from __future__ import annotations

import io
import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import digest, one_line
from hosts_helpers import image_model, make_corpus, reseal_export
from quantbench.cli import main


@pytest.fixture
def exported(workdir, capsys):
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=2)
    common = ["--variants", str(model), "--fixtures", str(labels), "--no-progress", "--jobs", "1"]
    assert main(["run", "--hosts", "local", "--tables", "a", "--export", "pi.qbr", *common]) == 0
    capsys.readouterr()
    (workdir / "hosts.toml").write_text('airgap = { kind = "imported", file = "pi.qbr" }\n')
    return ["run", "--hosts", "airgap", "--tables", "b", "--hosts-file", "hosts.toml", *common]


def _rewrite(path, change) -> None:
    """The export with each member's bytes passed through `change(name, data)`."""
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w") as tar:
        for m, data in members:
            data = change(m.name, data)
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))
    reseal_export(path)


def _table(name, edit):
    def change(member, data):
        if member != f"{name}.parquet":
            return data
        buf = io.BytesIO()
        pq.write_table(edit(pq.read_table(io.BytesIO(data))), buf)
        return buf.getvalue()
    return change


def _manifest_rows(name, n):
    def change(member, data):
        if member != "manifest.json":
            return data
        m = json.loads(data)
        m["rows"][name] = n
        return json.dumps(m).encode()
    return change


CASES = {
    "extra column": (_table("outputs", lambda t: t.append_column("note", pa.array(["x"] * t.num_rows))),
                     "outputs.parquet has column(s) quantbench does not write: note"),
    "row dropped": (_table("outputs", lambda t: t.slice(0, t.num_rows - 1)),
                    "outputs.parquet holds 1 rows, the manifest declares 2"),
    "rows doubled": (_table("fixtures", lambda t: pa.concat_tables([t, t])),
                     "fixtures.parquet holds 4 rows, the manifest declares 2"),
    "manifest lies": (_manifest_rows("outputs", 200000), "outputs.parquet holds 2 rows, the manifest declares 200000"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_altered_table_is_refused(workdir, exported, capsys, case):
    change, words = CASES[case]
    _rewrite(workdir / "pi.qbr", change)
    before = digest(workdir)
    assert main(exported) == 2
    line = one_line(capsys.readouterr().err, "run")
    assert line.startswith("quantbench run: error: host airgap: ") and f"pi.qbr: {words}" in line, line
    assert "nothing was imported" in line
    assert digest(workdir) == before and not (workdir / "b").exists()


def test_the_export_as_written_imports(workdir, exported, capsys):
    _rewrite(workdir / "pi.qbr", lambda name, data: data)
    assert main(exported) == 0


def test_an_earlier_imports_rows_fill_no_gap_in_the_current_file(workdir, capsys):
    """The imported host's file now holds 2 of the 3 fixtures; the tables still hold the third from an earlier
    import of a fuller file. equiv took it (3 fixtures compared, exit 0); now the host has only what its file
    holds, and the analysis says so instead of comparing a row the file does not have."""
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=3)
    common = ["--variants", str(model), "--fixtures", str(labels), "--no-progress", "--jobs", "1"]
    assert main(["run", "--hosts", "local", "--tables", "a", "--export", "full.qbr", *common]) == 0
    assert main(["run", "--hosts", "local", "--tables", "a2", "--export", "part.qbr", *common, "--limit", "2"]) == 0
    equiv = ["equiv", "--hosts", "x86,airgap", *common, "--decode", "none", "--hosts-file", "h.toml"]
    (workdir / "h.toml").write_text('airgap = { kind = "imported", file = "full.qbr" }\n')
    assert main(equiv) == 0
    capsys.readouterr()
    (workdir / "h.toml").write_text('airgap = { kind = "imported", file = "part.qbr" }\n')
    assert main(equiv) == 2
    line = one_line(capsys.readouterr().err, "equiv")
    assert line.endswith("host airgap: its imported file(s) hold no results for variant(s) fp32 (1 fixtures); export "
                         "them on the other machine, or analyse only the fixtures they hold"), line
    assert main([*equiv, "--limit", "2"]) == 0   # the fixtures the file holds are compared as usual
