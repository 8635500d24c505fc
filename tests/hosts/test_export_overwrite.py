"""`quantbench run --export FILE` never replaces a file already there unless --force says so, and refuses a folder
or a missing folder as FILE: one line, exit 2, before the run (no tables written, the file untouched)."""

import pytest

from cli_helpers import digest
from hosts_helpers import image_model, make_corpus
from quantbench.cli import main
from quantbench.hosts.imported import read_export


@pytest.fixture
def common(workdir):
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=1)
    return ["run", "--hosts", "local", "--tables", "a", "--variants", str(model), "--fixtures", str(labels),
            "--no-progress", "--jobs", "1"]


def _refused(capsys, workdir, argv, words):
    before = digest(workdir)
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("quantbench")]
    assert rc == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    assert digest(workdir) == before, "something was written"


def test_an_existing_export_is_kept_unless_forced(workdir, capsys, common):
    (workdir / "existing.qbr").write_bytes(b"last week's shard\n")
    _refused(capsys, workdir, [*common, "--export", "existing.qbr"],
             "--export existing.qbr: exists; --force replaces it (nothing was written)")
    assert (workdir / "existing.qbr").read_bytes() == b"last week's shard\n"
    assert main([*common, "--export", "existing.qbr", "--force"]) == 0
    manifest, _ = read_export(workdir / "existing.qbr")
    assert manifest["hosts"] == ["local"]


@pytest.mark.parametrize("target, words", [("d", "--export d: is a folder, not a file"),
                                           ("no/x.qbr", "--export no/x.qbr: its folder no does not exist")])
def test_a_folder_or_a_missing_folder_is_refused(workdir, capsys, common, target, words):
    (workdir / "d").mkdir()
    _refused(capsys, workdir, [*common, "--export", target], words)
    _refused(capsys, workdir, [*common, "--export", target, "--force"], words)
