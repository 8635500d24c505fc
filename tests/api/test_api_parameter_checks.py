"""A wrong type or value given to the Python API is a UserError (a ParameterError naming the parameter), as the
command line refuses the same in one line; never an AttributeError, TypeError or ValueError from deep inside, and
nothing is written."""

from __future__ import annotations

import math

import pytest

import quantbench
from cli_helpers import digest
from quantbench.api.equiv import Gates
from quantbench.api.options import Fixtures, Fleet, Output, Results, Session
from quantbench.errors import ParameterError, UserError

CALLS = [
    ("run(None, 'x86')", lambda: quantbench.run(None, "x86"), "fleet", "Fleet('x86,pi')"),
    ("run(fixtures='labels.json')", lambda: quantbench.run(fixtures="labels.json"), "fixtures", "Fixtures("),
    ("run(['v'], 'x86')", lambda: quantbench.run(["v"], "x86"), "fleet", "Fleet("),
    ("run(123)", lambda: quantbench.run(123), "variants", "variants folder or .onnx file"),
    ("equiv(gates='decision')", lambda: quantbench.equiv(gates="decision"), "gates", "Gates("),
    ("Fleet(123)", lambda: Fleet(123), "hosts", "host names"),
    ("Fleet(hosts_file=1)", lambda: Fleet("x86", hosts_file=1), "hosts_file", "file or folder name"),
    ("Results(root=None)", lambda: Results(root=None), "root", "file or folder name"),
    ("Fixtures(limit='2')", lambda: Fixtures(limit="2"), "limit", "whole number"),
    ("Fixtures(labels=b'x')", lambda: Fixtures(labels=b"x"), "labels", "file or folder name"),
    ("verify(None)", lambda: quantbench.verify(None), "release", "file or folder name"),
    ("verify(b'..')", lambda: quantbench.verify(b".."), "release", "file or folder name"),
    ("verify(sample='2')", lambda: quantbench.verify("r", sample="2"), "sample", "whole number"),
    ("make_release(None)", lambda: quantbench.make_release(None), "tag", "release's name as text"),
    ("calibrate(None)", lambda: quantbench.calibrate(None), "model", "file or folder name"),
    ("calibrate(per_cell='2')", lambda: quantbench.calibrate(per_cell="2"), "per_cell", "a whole number"),
    ("calibrate(per_cell=True)", lambda: quantbench.calibrate(per_cell=True), "per_cell", "a whole number"),
    ("calibrate(methods='static-minmax')", lambda: quantbench.calibrate(methods="static-minmax"), "methods",
     "a list"),
    ("calibrate(labels=1)", lambda: quantbench.calibrate(labels=1), "labels", "text or a path"),
    ("Session(config='a=b')", lambda: Session(config="a=b"), "config", "must map session config keys"),
    ("Session(threads='2')", lambda: Session(threads="2"), "threads", "whole number"),
    ("Gates(atol=nan)", lambda: Gates(atol=math.nan, gate="tensor"), "atol", "must be a finite number"),
    ("Gates(rtol=inf)", lambda: Gates(rtol=math.inf), "rtol", "must be a finite number"),
    ("Gates(atol=-1)", lambda: Gates(atol=-1.0), "atol", "must be at least 0"),
    ("Gates(budget=0.5)", lambda: Gates(budget=0.5), "budget", "whole number of flips"),
    ("Gates(budget='0')", lambda: Gates(budget="0"), "budget", "whole number of flips"),
    ("Gates(budget=-1)", lambda: Gates(budget=-1), "budget", "at least 0"),
    ("Gates(gate=['decision'])", lambda: Gates(gate=["decision"]), "gate", "comma-separated gate names"),
    ("run(export=1)", lambda: quantbench.run(fleet=Fleet("x86"), export=1), "export", "file or folder name"),
    ("run(cluster=1)", lambda: quantbench.run(fleet=Fleet("x86"), cluster=1), "cluster", "must be text"),
    ("equiv(fp32=1)", lambda: quantbench.equiv(fleet=Fleet("x86"), fp32=1), "fp32", "file or folder name"),
    ("Output(quiet='yes')", lambda: Output(quiet="yes"), "quiet", "True or False"),
    ("Output(verbose='x')", lambda: Output(verbose="x"), "verbose", "whole number"),
    ("make_release('t', hosts=1)", lambda: quantbench.make_release("t", hosts=1), "hosts", "host names"),
    ("make_release('t', archive=1)", lambda: quantbench.make_release("t", archive=1), "archive",
     "file or folder name"),
    ("calibrate(types=[('u8',)])", lambda: quantbench.calibrate(types=[("u8",)]), "types", "(activation, weight)"),
]


@pytest.mark.parametrize("what, call, param, words", CALLS, ids=[c[0] for c in CALLS])
def test_a_wrong_parameter_is_a_parameter_error_naming_it(workdir, what, call, param, words):
    before = digest(workdir)
    with pytest.raises(ParameterError) as info:
        call()
    text = str(info.value)
    assert info.value.param == param and text.startswith(param) and words in text and "\n" not in text, text
    assert digest(workdir) == before


SESSION_CONFIGS = [
    ({"SESSION.X64QUANTPRECISION": "1"}, "did you mean session.x64quantprecision?"),
    ({"session.x64quantprecison": "1"}, "did you mean session.x64quantprecision?"),
    ({"zzz.unknown": "1"}, "no session config key 'zzz.unknown'"),
    ({"intra_op_num_threads": "4"}, "a session option, not a session config entry: set it with threads"),
    ({"session.x64quantprecision": ""}, "empty value"),
    ({"session.x64quantprecision": "1\nX"}, "a config entry is one line"),
    ({"session.x64quantprecision": 1}, "session config entries map KEY to VALUE strings"),
]


@pytest.mark.parametrize("config, words", SESSION_CONFIGS)
def test_a_session_config_the_command_line_refuses_is_refused(config, words):
    """Session(config=...) goes through the check --session-config does (inputs/configkeys.check_entries)."""
    with pytest.raises(UserError) as info:
        Session(config=config)
    assert words in str(info.value) and str(info.value).startswith("Session config"), str(info.value)


def test_a_good_session_config_and_gates_still_build():
    assert Session(config={"session.x64quantprecision": "1"}).config == {"session.x64quantprecision": "1"}
    assert Gates(atol=0, rtol=1e-3, budget=2, gate="decision").budget == 2


def test_one_variant_given_as_text_is_one_variant_not_its_characters(workdir):
    """`run('results/variants/m')` iterated the string ('variants r: not found')."""
    with pytest.raises(UserError) as info:
        quantbench.run("results/variants/m", Fleet("x86"))
    assert str(info.value) == "variants results/variants/m: not found"
