"""The library names parameters and the CLI names flags: a library message points at a parameter
(ParameterError, errors.flag_mark) and the command line shows the flag the user typed, unchanged."""

from __future__ import annotations

import types

import pytest

from quantbench.cli import cli
from quantbench.cli import main
from quantbench.errors import ParameterError, UserError, flag_mark, marked
from quantbench.quantize.calibration import check_limits, parse_memory
from quantbench.inputs.variantdir import resolve_variants


def cli_text(exc: UserError, command: str) -> str:
    """What `quantbench COMMAND` prints for `exc` after "error: "."""
    return cli._for_cli(exc, cli.build_parser(commands=[command], config=False), types.SimpleNamespace(command=command))


def test_a_calibration_limit_names_its_parameter():
    with pytest.raises(ParameterError) as e:
        parse_memory("lots")
    assert e.value.param == "max_memory" and "--" not in str(e.value)
    assert cli_text(e.value, "calibrate") == "--max-memory lots: expected a size like 2GiB, 512M or a number of bytes"
    for kwargs, param in (({"chunk_size": 0}, "chunk_size"), ({"threads": 0}, "threads"),
                          ({"percentile": 101}, "percentile")):
        with pytest.raises(ParameterError) as e:
            check_limits(**kwargs)
        assert e.value.param == param and "--" not in str(e.value)


def test_a_message_points_at_a_parameter_and_the_cli_names_its_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        resolve_variants(["nope"])
    assert str(e.value) == "variants nope: not found"
    capsys.readouterr()
    assert main(["run", "--hosts", "x86", "--variants", "nope", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == "quantbench run: error: --variants nope: not found"


def test_a_flag_of_another_command_is_named_too():
    exc = UserError(f"index.json: expected a list of variants; rerun `quantbench calibrate {flag_mark('force')}`")
    assert str(exc).endswith("rerun `quantbench calibrate force`")
    assert cli_text(exc, "run").endswith("rerun `quantbench calibrate --force`")


def test_a_wrapped_parameter_error_keeps_its_flag():
    inner = ParameterError("decode", f"output 'x' has shape [3]; pass another {flag_mark('decode')}", "yolo")
    outer = UserError(f"model m: {marked(inner)}; or {flag_mark('decode')} none")
    assert str(outer) == "model m: decode yolo: output 'x' has shape [3]; pass another decode; or decode none"
    assert cli_text(outer, "equiv") == ("model m: --decode yolo: output 'x' has shape [3]; pass another --decode; "
                                        "or --decode none")


def test_a_refused_plugin_names_the_flag_that_asked_for_it():
    """A plug-in refused for want of consent, asked for by a parameter (errors.flag_mark), names that parameter's flag
    on the command line, not the bare parameter, next to the flag that allows it."""
    from quantbench.errors import PluginNotAllowed

    exc = PluginNotAllowed(f"{flag_mark('decode')} asks to run plug-in m.py:f (the file m.py)", "m.py:f")
    assert str(exc).startswith("decode asks")
    assert cli_text(exc, "equiv") == "--decode asks to run plug-in m.py:f (the file m.py): pass --allow-plugins to run it"


def test_no_fixtures_to_run_points_at_the_fixture_parameters():
    from quantbench.inputs.fixtures import no_fixtures_message

    exc = UserError(no_fixtures_message("l.json", "eval"))
    assert "--" not in str(exc)
    assert cli_text(exc, "equiv").endswith('mark some with "split": "eval", or pass --split / --fixtures')
