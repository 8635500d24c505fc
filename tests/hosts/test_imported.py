"""An exported results file (an air-gapped machine) merged with a local run, through the CLI."""

import json
import tarfile

import pytest

from hosts_helpers import host_results_index, image_model, make_corpus
from quantbench.store import partread
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.hosts.imported import export_results, import_results


def test_export_then_import_merges_with_local_run(workdir, capsys):
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus")
    common = ["--variants", str(model), "--fixtures", str(labels), "--no-progress", "--jobs", "1"]
    # the "air-gapped" machine: its own tables, then one export file
    assert main(["run", "--hosts", "local", "--tables", "a", "--export", "pi.qbr", *common]) == 0
    assert "exported 3 output rows of host(s) local to pi.qbr" in capsys.readouterr().out
    with tarfile.open(workdir / "pi.qbr") as tar:
        assert sorted(tar.getnames()) == ["fixtures.parquet", "hosts.parquet", "manifest.json", "models.parquet", "outputs.parquet"]
    # the workbench: a local run plus the imported host
    (workdir / "hosts.toml").write_text('airgap = { kind = "imported", file = "pi.qbr" }\n')
    argv = ["run", "--hosts", "x86,airgap", "--tables", "b", "--hosts-file", "hosts.toml", *common]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "airgap" in out and "imported" in out
    idx = host_results_index("b")
    by_host = {}
    for (host, vid, fid, name), sha in idx.items():
        by_host.setdefault(host, {})[(vid, fid, name)] = sha
    assert set(by_host) == {"x86", "airgap"}
    assert by_host["x86"] == by_host["airgap"] and len(by_host["x86"]) == 3  # same machine, same bytes
    hosts = {r["host"]: r for r in partread.read("hosts", "b").to_pylist()}
    assert hosts["airgap"]["kind"] == "imported"
    assert json.loads(hosts["airgap"]["fingerprint"])["imported_from"]["host"] == "local"
    assert hosts["airgap"]["fingerprint_id"] == hosts["x86"]["fingerprint_id"]
    # merging again changes nothing (content-addressed parts)
    before = {t: partread.parts(t, "b") for t in ("fixtures", "models", "hosts", "outputs")}
    import_results(workdir / "pi.qbr", "airgap", tables_root="b")
    assert {t: partread.parts(t, "b") for t in before} == before
    # same tables, same export bytes
    export_results(workdir / "again.qbr", ["local"], tables_root="a")
    assert (workdir / "again.qbr").read_bytes() == (workdir / "pi.qbr").read_bytes()


def test_bad_import_files(workdir, capsys):
    (workdir / "bad.qbr").write_bytes(b"not a tar file at all")
    (workdir / "hosts.toml").write_text('air = { kind = "imported", file = "bad.qbr" }\n'
                                        'gone = { kind = "imported", file = "missing.qbr" }\n')
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=1)
    for name, words in (("air", "not a readable quantbench results export"), ("gone", "results file not found")):
        rc = main(["run", "--hosts", name, "--hosts-file", "hosts.toml", "--variants", str(model),
                   "--fixtures", str(labels), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and f"host {name}" in err and words in err and len(err.strip().splitlines()) == 1
    with pytest.raises(UserError, match="no results for host"):
        export_results(workdir / "x.qbr", ["x86"], tables_root="nothing")
    assert not (workdir / "x.qbr").exists()
