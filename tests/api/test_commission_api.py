"""`quantbench.commission(...)`: the command line's defaults, the kit it returns, a mistake naming the parameter."""

import inspect

import pytest

import quantbench
from quantbench.api.options import Results
from quantbench.errors import ParameterError


def test_the_defaults_are_the_command_lines():
    from quantbench.cli import build_parser

    parser = build_parser(config=False, commands=["commission"])
    cli = {a.dest: a.default for a in parser._qb_leaves["commission"]._actions}
    params = inspect.signature(quantbench.commission).parameters
    assert (params["count"].default, params["force"].default) == (cli["count"], cli["force"])
    assert params["results"].default == Results(cli["results"])


def test_the_api_returns_the_kit_and_names_the_parameter(results, tmp_path):
    kit = quantbench.commission("fp32", tmp_path / "kit", count=2, results=Results(str(results)))
    assert kit.folder == tmp_path / "kit" and kit.fixtures == 2 and kit.classes == [("A", ["x86"])]
    assert (kit.folder / "check.py").is_file() and kit.expected["variant"]["name"] == "fp32"
    with pytest.raises(ParameterError, match=r"^count=0: must be a whole number of fixtures, at least 1$"):
        quantbench.commission("fp32", tmp_path / "other", count=0, results=Results(str(results)))
    assert not (tmp_path / "other").exists()
