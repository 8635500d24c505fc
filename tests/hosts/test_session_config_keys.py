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
