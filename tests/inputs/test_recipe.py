"""quantbench.inputs.sidecarfile is the one owner of a model's sidecar and input recipe: a command reads its --sidecar file
once, and a sidecar's input block is checked once (when read), whichever commands derive a spec from it."""

import json

import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.inputs import sidecarfile
from quantbench.cli import main


@pytest.fixture
def proj(workdir):
    labels, _ = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    return workdir, tiny_model(workdir / "m" / "tiny.onnx"), labels


@pytest.fixture
def spy(monkeypatch):
    """The real reader and checker, counted: path -> sidecar reads, source -> input block checks."""
    reads, checks = {}, {}
    read, check = sidecarfile.read_sidecar, sidecarfile.check_input_block

    def counted_read(p, required=False):
        reads[str(p)] = reads.get(str(p), 0) + 1
        return read(p, required)

    def counted_check(block, source):
        checks[str(source)] = checks.get(str(source), 0) + 1
        return check(block, source)

    monkeypatch.setattr(sidecarfile, "read_sidecar", counted_read)
    monkeypatch.setattr(sidecarfile, "check_input_block", counted_check)
    return reads, checks


def test_equiv_reads_its_sidecar_file_once(proj, spy, capsys):
    workdir, model, labels = proj
    side = workdir / "side.json"
    side.write_text(model.with_suffix(".json").read_text())
    rc = main(["equiv", "--hosts", "x86", "--variants", str(model), "--sidecar", str(side), "--fixtures", str(labels),
               "--decode", "none", "--no-progress", "--no-plots"])
    assert rc == 0, capsys.readouterr().err
    reads, checks = spy
    assert reads == {str(side): 1}
    assert checks == {str(side): 1}   # the block it states is checked when read, not again for the spec


def test_equiv_reads_the_sidecar_beside_a_bare_model_once(proj, spy, capsys):
    """The decoders, the fixtures and the analysed variants all take the one sidecar read for the variant."""
    workdir, model, labels = proj
    rc = main(["equiv", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--decode", "none",
               "--no-progress", "--no-plots"])
    assert rc == 0, capsys.readouterr().err
    side = str(model.with_suffix(".json"))
    assert spy == ({side: 1}, {side: 1})


def test_calibrate_reads_its_sidecar_file_once(proj, spy, capsys):
    workdir, model, labels = proj
    side = workdir / "side.json"
    side.write_text(model.with_suffix(".json").read_text())
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--sidecar", str(side), "--per-cell",
                 "2", "--methods", "dynamic", "--no-progress"]) == 0, capsys.readouterr().err
    assert spy == ({str(side): 1}, {str(side): 1})


def test_a_sidecar_block_is_checked_once_and_what_the_model_adds_once(proj, spy, capsys):
    """run on a bare model: its sidecar beside is read and checked once; a block without a shape (the model's
    dims fill it in) is checked again as the spec it makes, which is where a model's channels are caught."""
    workdir, model, labels = proj
    side = model.with_suffix(".json")
    assert main(["run", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"]) == 0
    reads, checks = spy
    assert reads == {str(side): 1} and checks == {str(side): 1}
    block = json.loads(side.read_text())["input"]
    del block["shape"]
    side.write_text(json.dumps({"input": block}))
    reads.clear(), checks.clear()
    assert main(["run", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"]) == 0
    assert reads == {str(side): 1} and checks == {str(side): 1, str(model): 1}, capsys.readouterr().err
