"""Values that used to pass without a word: `--cluster ''` (ran everything here), `--as ../../x` (an export under a
name no host can have), `python = ""` in a hosts file, `noise --batch 0`. Each is one line, exit 2, nothing written."""

from __future__ import annotations

import pytest

from cli_helpers import digest, one_line
from hosts_helpers import image_model, make_corpus
from quantbench.cli import main


def _refused(capsys, wd, argv, command, message) -> None:
    before = digest(wd)
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:   # argparse refusals
        rc = exc.code
    line = one_line(capsys.readouterr().err, command)
    assert rc == 2 and message in line, line
    assert digest(wd) == before


@pytest.fixture
def inputs(workdir):
    return ["--variants", image_model(workdir / "m.onnx"), "--fixtures", make_corpus(workdir / "corpus"),
            "--no-progress"]


@pytest.mark.parametrize("command", ["run", "equiv"])
def test_an_empty_cluster_address_is_refused(workdir, capsys, inputs, command):
    _refused(capsys, workdir, [command, "--hosts", "x86", *inputs, "--cluster", ""], command,
             "argument --cluster: is empty; give the scheduler's address, e.g. tcp://HOST:8786")


@pytest.mark.parametrize("name", ["../../x", "a/b", "", "all"])
def test_an_export_name_must_be_a_host_name(workdir, capsys, inputs, name):
    _refused(capsys, workdir, ["run", "--hosts", "x86", *inputs, "--export", "e.qbr", "--as", name], "run",
             f"--as: host name {name!r}: use letters, digits, '.', '_' or '-'")


@pytest.mark.parametrize("entry, key", [('{ kind = "local", python = "" }', "python"),
                                        ('{ kind = "ssh", address = "pi@b", python = " " }', "python"),
                                        ('{ kind = "local", onnxruntime = "" }', "onnxruntime")])
def test_an_empty_hosts_file_value_is_refused(workdir, capsys, inputs, entry, key):
    (workdir / "h.toml").write_text(f"box = {entry}\n")
    _refused(capsys, workdir, ["run", "--hosts", "box", "--hosts-file", "h.toml", *inputs], "run",
             f"h.toml:1: host 'box': {key} is empty; give a value or leave the key out")


@pytest.mark.parametrize("batch", ["0", "1", "-3"])
def test_a_batch_composition_of_fewer_than_two_is_refused(workdir, capsys, batch):
    argv = ["noise", "--hosts", "x86", "--variant", image_model(workdir / "m.onnx"), "--fixtures",
            make_corpus(workdir / "corpus"), "--tables", "t", "--batch", batch]
    _refused(capsys, workdir, argv, "noise",
             f"--batch {batch}: must be at least 2 (each fixture alone against inside a batch of that size)")
