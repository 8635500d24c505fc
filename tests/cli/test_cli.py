"""The CLI's surface: help for every command, and user mistakes as one line + exit 2."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import quantbench.cli.commands
from quantbench.cli import build_parser, main
from quantbench.cli import config as C
from quantbench.cli.commands import COMMAND_HELP, COMMANDS, declared


def _err_lines(text):
    return [l for l in text.splitlines() if l.strip()]


def test_help_lists_every_command_with_a_sentence(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"    {name}" in out, name


def test_the_command_table_lists_every_command_module_with_its_help():
    """`quantbench --help` lists COMMAND_HELP without importing the modules; each listed module must still import (a
    broken command is an error, never a silently missing one) and its HELP must be the sentence listed."""
    on_disk = {p.stem for p in Path(quantbench.cli.commands.__file__).parent.glob("*.py")} - {"__init__"}
    assert set(COMMANDS) == on_disk
    for name, text in COMMAND_HELP.items():
        assert importlib.import_module(f"quantbench.cli.commands.{name}").HELP == text, name


def test_the_defaults_tables_names_match_the_whole_parser():
    """A defaults table is checked against the options and sub-actions the command modules declare, read from their
    source without importing every command (commands.declared): exactly every command's options, of the kinds the
    parser gives them, and sub-actions."""
    leaves = build_parser(config=False)._qb_leaves
    kinds: dict = {}
    for leaf in leaves.values():
        for dest, action in C.option_actions(leaf).items():
            kinds.setdefault(dest, set()).add(isinstance(action, C._SWITCHES))
    assert declared().options == {d: frozenset(k) for d, k in kinds.items()}
    assert declared().subcommands == tuple(n for n in leaves if " " in n)


def test_no_hand_kept_list_of_options_remains():
    """The options are declared once, by the parser's argument groups: no module of the command line keeps a list
    of option names beside them (OPTION_KEYS was one, 92 names long)."""
    import quantbench.cli.commands as commands

    assert not hasattr(commands, "OPTION_KEYS") and not hasattr(commands, "SUBCOMMANDS")
    assert not hasattr(commands, "MIXED_KIND_KEYS")


_LOADED = ("import sys\nfrom quantbench.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
           "print('loaded:', sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('quantbench.cli.commands.')))")


@pytest.mark.parametrize("argv, loaded", [
    (["--help"], []),
    ([], []),
    (["equiv", "--help"], ["equiv"]),
    (["hosts", "list", "--help"], ["hosts"]),
    (["config", "--help"], sorted(COMMANDS)),   # `quantbench config` lists every command's options
])
def test_a_command_line_imports_only_the_command_it_runs(tmp_path, argv, loaded):
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", _LOADED, *argv], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == f"loaded: {loaded}"
    if argv[:1] == ["--help"]:
        assert all(f"    {name}" in p.stdout for name in COMMANDS)
    # a defaults table is checked against the command table, not by importing every command
    (tmp_path / "quantbench.toml").write_text('[defaults]\nhosts = "x86"\nbudget = 3\n')
    p = subprocess.run([sys.executable, "-c", _LOADED, *argv], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert p.stdout.splitlines()[-1] == f"loaded: {loaded}"


def test_help_loads_no_numpy(tmp_path):
    """`quantbench --help` (every invocation's first step) loads neither numpy nor the variants, fixtures or
    recipe modules: only the commands that run hosts import them (through quantbench/api/), nor the argparse types
    that load the decoders (quantbench/cli/argtypes.py)."""
    root = Path(__file__).resolve().parents[2]
    code = ("import sys\nfrom quantbench.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('loaded:', sorted(m for m in ('numpy', 'quantbench.inputs.variantdir', 'quantbench.inputs.fixtures',"
            " 'quantbench.inputs.sidecarfile', 'quantbench.cli.argtypes') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "loaded: []"


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_help_shows_options_with_defaults(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: quantbench {name}")
    assert "options:" in out
    # each default once: never an empty one appended, never a second one after the help's own
    for empty in ("(default: None)", "(default: False)", "(default: [])"):
        assert empty not in out, (name, empty)
    text = " ".join(out.split())
    assert "(default: the bundled corpus) (default:" not in text


def test_unknown_option_is_one_line_exit_2_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "quantbench", "diff", "a.onnx", "b.onnx", "--no-such-option"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = _err_lines(proc.stderr)
    assert len(lines) == 1 and "--no-such-option" in lines[0] and "Traceback" not in proc.stderr


def test_missing_model_file(tmp_path, capsys):
    missing = tmp_path / "nowhere.onnx"
    assert main(["lint", str(missing)]) == 2
    lines = _err_lines(capsys.readouterr().err)
    assert len(lines) == 1 and str(missing) in lines[0] and "not found" in lines[0]


def test_non_onnx_file(tmp_path, capsys):
    bogus = tmp_path / "photo.onnx"
    bogus.write_bytes(b"\x89PNG\r\n\x1a\n not a model at all")
    assert main(["diff", str(bogus), str(bogus)]) == 2
    lines = _err_lines(capsys.readouterr().err)
    assert len(lines) == 1 and str(bogus) in lines[0] and "not an ONNX model" in lines[0]


def test_coco_json_referencing_a_missing_image(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "gone.png", "width": 128, "height": 128, "split": "eval"}],
        "annotations": [], "categories": [{"id": 1, "name": "bottle"}],
    }))
    rc = main(["run", "--hosts", "x86", "--fixtures", str(labels), "--no-progress"])
    assert rc == 2
    lines = _err_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "gone.png" in lines[0] and str(labels) in lines[0]
    assert not (tmp_path / "results" / "tables" / "outputs").exists()


def test_parser_builds_without_heavy_imports():
    code = ("import sys; from quantbench.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('onnxruntime', 'torch', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
