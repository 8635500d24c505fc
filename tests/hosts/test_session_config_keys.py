"""A session config key onnxruntime does not know (a typo: `session.x64quantprecison=1`) is refused with the nearest
key it knows, before anything runs, wherever a key is given (--session-config, a --hosts item's +KEY=VALUE,
`hosts check`); onnxruntime would ignore it and the run would show it as applied."""

from __future__ import annotations

import pytest

from cli_helpers import digest, one_line
from hosts_helpers import image_model, make_corpus
from quantbench.cli import main
from quantbench.inputs.configkeys import check_config_keys, known_keys

TYPO = "session.x64quantprecison"
HINT = f"onnxruntime has no session config key '{TYPO}'; did you mean session.x64quantprecision?"


def _run(capsys, *argv) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def test_the_keys_are_read_from_this_onnxruntime():
    keys = known_keys()
    assert {"session.x64quantprecision", "session.qdqisint8allowed", "session.intra_op.allow_spinning"} <= keys
    assert TYPO not in keys
    check_config_keys({"session.x64quantprecision": "1", "ep.context_enable": "1"}, "here")   # ep.*: not ours


@pytest.mark.parametrize("argv, command", [
    (["run", "--hosts", "x86", "--session-config", f"{TYPO}=1"], "run"),
    (["equiv", "--hosts", "x86", "--session-config", f"{TYPO}=1", "--results", "r"], "equiv"),
    (["hosts", "check", f"x86+{TYPO}=1"], "hosts"),
])
def test_a_misspelt_session_config_key_is_refused_before_anything_runs(workdir, capsys, argv, command):
    model = image_model(workdir / "i.onnx")
    corpus = make_corpus(workdir / "corpus")
    extra = ["--variants", model, "--fixtures", corpus, "--no-progress"] if command != "hosts" else []
    before = digest(workdir)
    rc, err = _run(capsys, *argv, *extra)
    assert rc == 2 and HINT in one_line(err, command)
    assert digest(workdir) == before


def test_a_known_key_still_applies(workdir, capsys):
    rc, err = _run(capsys, "hosts", "check", "x86+session.x64quantprecision=1")
    assert "no session config key" not in err


# Hostile config entries: each refused in one line (exit 2) before anything is read or written, whichever
# option gives it. (key=value items, the hint the line carries)
BAD_ENTRIES = [
    (["SESSION.X64QUANTPRECISION=1"], "no session config key 'SESSION.X64QUANTPRECISION'; did you mean "
                                      "session.x64quantprecision?"),
    (["zzz.unknown=1"], "onnxruntime has no session config key 'zzz.unknown'"),
    (["foo=bar"], "onnxruntime has no session config key 'foo'"),
    (["intra_op_num_threads=4"], "intra_op_num_threads is a session option, not a session config entry: set it "
                                 "with --threads"),
    (["graph_optimization_level=basic"], "graph_optimization_level is a session option, not a session config "
                                         "entry: set it with --graph-opt"),
    (["session.x64quantprecision="], "session.x64quantprecision: empty value"),
    (["session.x64quantprecision=1\nX"], "a config entry is one line"),
    (["session.x64quantprecision=1", "session.x64quantprecision=0"], "session.x64quantprecision: given twice "
                                                                     "('1', then '0'); give one value per key"),
]


@pytest.mark.parametrize("entries, hint", BAD_ENTRIES)
@pytest.mark.parametrize("command", ["run", "calibrate"])
def test_a_config_entry_onnxruntime_would_ignore_or_take_otherwise_is_refused(workdir, capsys, entries, hint,
                                                                              command):
    """--session-config (run) and --require-session (calibrate, which records it in the recipe): onnxruntime
    ignores an unknown key (case matters), takes the last of two values, an empty string, a second line."""
    model = image_model(workdir / "i.onnx")
    corpus = make_corpus(workdir / "corpus")
    option = "--session-config" if command == "run" else "--require-session"
    extra = (["--hosts", "x86", "--variants", model, "--fixtures", corpus] if command == "run"
             else ["--model", model, "--labels", corpus])
    before = digest(workdir)
    rc, err = _run(capsys, command, *extra, *[a for e in entries for a in (option, e)], "--no-progress")
    line = one_line(err, command)
    assert rc == 2 and line.startswith(f"quantbench {command}: error: {option}") and hint in line, line
    assert digest(workdir) == before


def test_a_session_option_given_as_a_host_override_is_checked(workdir, capsys):
    rc, err = _run(capsys, "hosts", "check", "x86+intra_op_num_threads=-1")
    line = one_line(err, "hosts")
    assert rc == 2 and "intra_op_num_threads=-1: must be at least 1" in line, line


@pytest.mark.parametrize("item, hint", [
    ("x86+SESSION.X64QUANTPRECISION=1", "did you mean session.x64quantprecision?"),
    ("x86+session.x64quantprecision=", "session.x64quantprecision: empty value"),
    ("x86+session.x64quantprecision=1+session.x64quantprecision=0", "given twice ('1', then '0')"),
])
def test_a_host_override_entry_is_checked_as_the_flag_is(workdir, capsys, item, hint):
    rc, err = _run(capsys, "hosts", "check", item)
    line = one_line(err, "hosts")
    assert rc == 2 and hint in line, line
