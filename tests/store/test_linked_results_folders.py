"""A results folder whose `tables` (or one table's folder) is a symbolic link out of it, as a cloned repository
may ship it: every write followed the link. Now the command refuses in one line naming the link, and nothing is
written through it."""

from __future__ import annotations

import pytest

from cli_helpers import digest, one_line
from hosts_helpers import image_model, make_corpus
from quantbench.cli import main


@pytest.mark.parametrize("link", ["results/tables", "results/tables/outputs"])
@pytest.mark.parametrize("command", ["run", "equiv"])
def test_a_tables_link_out_of_the_results_folder_is_refused(workdir, capsys, link, command):
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=1)
    outside = workdir / "elsewhere"
    outside.mkdir()
    (workdir / link).parent.mkdir(parents=True, exist_ok=True)
    (workdir / link).symlink_to(outside)
    before = digest(workdir)
    argv = [command, "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"]
    assert main(argv + (["--decode", "none"] if command == "equiv" else [])) == 2
    line = one_line(capsys.readouterr().err, command)
    assert f"error: {link}: is a symbolic link out of {link.rsplit('/', 1)[0]} (to {outside})" in line, line
    assert "--results" in line
    assert list(outside.iterdir()) == [] and digest(workdir) == before


def test_a_link_inside_the_results_folder_is_followed(workdir, capsys):
    model = image_model(workdir / "m.onnx")
    labels = make_corpus(workdir / "corpus", count=1)
    (workdir / "results" / "t2").mkdir(parents=True)
    (workdir / "results" / "tables").symlink_to("t2")
    assert main(["run", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress"]) == 0
    assert list((workdir / "results" / "t2" / "outputs").glob("part-*.parquet"))
