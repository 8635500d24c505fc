"""Option defaults from files: a hosts file's `[defaults]` table applies whichever way the file is named
(./quantbench.toml or --hosts-file), a defaults file writes only inside the working folder, and a key shared
by commands whose options take different kinds of value means what each command's option takes."""

from __future__ import annotations

import json

import pytest

from calib_helpers import make_corpus, tiny_model
from cli_helpers import digest
from quantbench.cli import config as C
from quantbench.cli.cli import _with_hosts_file_defaults, build_parser, main
from quantbench.cli.commands import declared


def _run(capsys, *args) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:   # argparse refusals
        rc = exc.code
    got = capsys.readouterr()
    return rc, got.out, got.err


def _one_line(err: str) -> str:
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.startswith("quantbench")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def calibrated(workdir, capsys):
    """The tiny model calibrated into ./results (fp32, dynamic and static variants; no decode block)."""
    labels, _ = make_corpus(workdir / "corpus", n_litter=12, n_negative=12, n_eval=4)
    assert main(["calibrate", "--model", str(tiny_model(workdir / "models" / "tiny.onnx")), "--labels", str(labels),
                 "--per-cell", "3", "--no-progress"]) == 0
    capsys.readouterr()
    return workdir


@pytest.mark.parametrize("where", ["quantbench.toml", "g.toml"])
def test_a_hosts_files_defaults_table_applies_however_the_file_is_named(calibrated, capsys, where):
    """`gate = "tensor"` in the `[defaults]` of ./quantbench.toml or of a file given with --hosts-file: both gate
    the run (the static variants are beyond the tensor tolerance: exit 1); without it, exit 0."""
    argv = ["equiv", "--hosts", "x86", "--no-progress", "--decode", "none"]
    assert _run(capsys, *argv)[0] == 0
    (calibrated / where).write_text('[defaults]\ngate = "tensor"\n')
    extra = ["--hosts-file", where] if where != "quantbench.toml" else []
    rc, _, err = _run(capsys, *argv, *extra)
    assert rc == 1 and "gate failed: tensor:" in err, err
    rc, out, _ = _run(capsys, *argv, *extra, "--json")
    assert rc == 1 and json.loads(out)["settings"]["gates"] == ["tensor"]


def test_a_hosts_files_defaults_sit_above_the_folders_and_below_the_flags(workdir, capsys):
    (workdir / "quantbench.toml").write_text('[defaults]\nbudget = 3\nthreshold = 0.3\n')
    (workdir / "g.toml").write_text('[defaults]\nbudget = 5\n')
    parser = build_parser(commands=["equiv"])
    args = parser.parse_args(["equiv", "--hosts-file", "g.toml"])
    args = _with_hosts_file_defaults(parser, ["equiv", "--hosts-file", "g.toml"], args)
    assert (args.budget, args.threshold) == (5, 0.3)
    args = _with_hosts_file_defaults(parser, ["equiv", "--hosts-file", "g.toml", "--budget", "7"], args)
    assert args.budget == 7
    assert C.hosts_file_source(workdir / "quantbench.toml") is None   # the folder's own file is read once


@pytest.mark.parametrize("text, key, command", [
    ('[defaults]\nresults = "/etc"\n', "results", "equiv"),
    ('[defaults]\nresults = "../elsewhere"\n', "results", "equiv"),
    ('[defaults.equiv]\nresults = "/tmp"\n', "results", "equiv"),
    ('[defaults]\ntables = "/var/tmp/t"\n', "tables", "run"),
    ('[defaults]\nresults = "~/x"\n', "results", "equiv"),   # was: a folder named `~` made here
    ('[defaults]\nresults = "~"\n', "results", "run"),
])
@pytest.mark.parametrize("where", ["quantbench.toml", "g.toml"])
def test_a_defaults_file_writes_only_inside_the_working_folder(workdir, capsys, text, key, command, where):
    """A cloned repository's `[defaults] results = "/etc"` is refused before anything is written: one line naming
    the file and the key, exit 2; the same folder given on the command line is the user's choice."""
    (workdir / where).write_text(text)
    extra = ["--hosts-file", where] if where != "quantbench.toml" else []
    before = digest(workdir)
    rc, _, err = _run(capsys, command, "--hosts", "x86", "--no-progress", *extra)
    line = _one_line(err)
    assert rc == 2 and line.startswith(f"quantbench: error: {where}: [defaults") and f"] {key}: " in line, line
    assert f"give --{key} on the command line" in line
    assert digest(workdir) == before


def test_a_defaults_results_folder_inside_the_working_folder_is_used(workdir, capsys):
    (workdir / "quantbench.toml").write_text('[defaults]\nresults = "out/r"\n')
    assert build_parser(commands=["equiv"]).parse_args(["equiv"]).results == "out/r"


def test_a_hosts_file_cannot_name_another_hosts_file(workdir, capsys):
    (workdir / "g.toml").write_text('[defaults]\nhosts-file = "h.toml"\n')
    before = digest(workdir)
    rc, _, err = _run(capsys, "run", "--hosts", "x86", "--hosts-file", "g.toml", "--no-progress")
    assert rc == 2 and "g.toml: [defaults] hosts-file: a hosts file cannot name another hosts file" in _one_line(err)
    assert digest(workdir) == before


@pytest.mark.parametrize("command", [["config"], ["config", "--all"], ["diff", "a.onnx", "b.onnx"]])
def test_a_shared_gate_default_means_what_each_commands_option_takes(workdir, capsys, command):
    """`[defaults] gate = "decision"` is equiv's gate names; diff's --gate is a switch, which it leaves alone:
    config lists it for equiv and ci, built-in for diff, and diff runs (here: to its own error about the files)."""
    (workdir / "quantbench.toml").write_text('[defaults]\ngate = "decision"\n')
    rc, out, err = _run(capsys, *command)
    assert "takes true or false" not in err
    if command[0] == "diff":
        assert rc == 2 and "a.onnx" in _one_line(err)
        return
    assert rc == 0, err
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("gate ")]
    assert sorted(rows) == [["gate", "False", "built-in", "diff"],
                            ["gate", "decision", "quantbench.toml", "[defaults]", "equiv,ci"]]


def test_a_shared_gate_default_of_the_other_kind_applies_to_diff_only(workdir, capsys):
    (workdir / "quantbench.toml").write_text('[defaults]\ngate = true\n')
    parser = build_parser(commands=["config"])
    assert parser._qb_leaves["diff"].get_default("gate") is True
    assert parser._qb_leaves["equiv"].get_default("gate") is None


def test_a_key_of_one_kind_everywhere_is_still_checked(workdir, capsys):
    """Only keys whose commands differ in kind are skipped where the kind does not fit: `no-progress = "yes"` is
    refused as before."""
    (workdir / "quantbench.toml").write_text('[defaults]\nno-progress = "yes"\n')
    rc, _, err = _run(capsys, "config")
    assert rc == 2 and "--no-progress takes true or false (got 'yes')" in _one_line(err)


def test_the_mixed_kind_keys_are_exactly_the_options_whose_commands_differ_in_kind():
    from quantbench.cli import build_parser
    kinds: dict = {}
    for leaf in build_parser(config=False)._qb_leaves.values():
        for dest, action in C.option_actions(leaf).items():
            kinds.setdefault(dest, set()).add(isinstance(action, C._SWITCHES))
    assert declared().mixed == {d for d, k in kinds.items() if len(k) > 1}
