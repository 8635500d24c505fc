"""The results folder has one option on every command, --results DIR (tables under DIR/tables); the old
--tables DIR (the tables folder itself) still works for one release, saying on stderr that it goes."""

import pytest

from quantbench.store import partwrite
from quantbench.cli import build_parser, main
from quantbench.cli.groups import TABLES_ALIAS_REMOVED_IN

#: the commands that write or read the results folder
RESULTS_COMMANDS = ("run", "equiv", "lint", "latency", "tables", "localize", "noise", "remedy", "report", "release",
                    "verify", "commission")
#: the ones that took --tables before --results
OLD_TABLES = ("run", "lint", "latency", "tables", "localize", "noise", "remedy")


def _options(parser, command) -> set:
    leaves = {n: p for n, p in parser._qb_leaves.items() if n == command or n.startswith(command + " ")}
    parents = [parser._subparsers._group_actions[0].choices[command]]
    return {o for p in [*leaves.values(), *parents] for a in p._actions for o in a.option_strings}


@pytest.mark.parametrize("command", RESULTS_COMMANDS)
def test_every_command_names_the_results_folder_results(command):
    opts = _options(build_parser(config=False, commands=[command]), command)
    assert "--results" in opts
    assert ("--tables" in opts) == (command in OLD_TABLES)


def _one_table(root):
    partwrite.append("lint", [{"variant_id": "v", "model": "m.onnx", "node": "conv", "op_type": "Conv", "k": 9,
                            "act_type": "u8", "weight_type": "s8", "x86_saturating_pairs": 0,
                            "neon_wrapping_pairs": 0, "int32_ok": True, "tiers": [], "reason": ""}], root=root)


def test_the_old_tables_option_still_works_and_says_it_goes(workdir, capsys):
    _one_table(workdir / "elsewhere" / "tables")
    assert main(["tables", "--tables", "elsewhere/tables", "info"]) == 0
    cap = capsys.readouterr()
    assert "lint" in cap.out
    notes = [ln for ln in cap.err.splitlines() if "deprecated" in ln]
    assert notes == [f"note: --tables is deprecated and goes in {TABLES_ALIAS_REMOVED_IN}: use "
                     "--results DIR (tables under DIR/tables)"]


def test_the_results_option_reads_the_tables_under_it_without_a_note(workdir, capsys):
    _one_table(workdir / "elsewhere" / "tables")
    assert main(["tables", "--results", "elsewhere", "info"]) == 0
    cap = capsys.readouterr()
    assert "lint" in cap.out and "deprecated" not in cap.err
    assert main(["tables", "info"]) == 0   # the default results/ has no tables
    assert "lint" not in capsys.readouterr().out
