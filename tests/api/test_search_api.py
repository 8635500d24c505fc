"""`quantbench.search(...)`: the search the `search` command runs, from Python: the chosen variant, every
candidate tried as a pyarrow Table, and parameter names (never flags) in its one-line errors."""

from __future__ import annotations

import json
import os

import pytest

import quantbench
from quantbench import Fleet
from quantbench.errors import UserError


@pytest.fixture
def calibrated(workdir):
    from explain_helpers import bright_corpus, saturating_image_model
    from quantbench.cli import main

    model = saturating_image_model(workdir / "m.onnx")
    (workdir / "m.json").write_text(json.dumps({"decode": {"kind": "classifier-softmax", "logits": "logits"}}))
    labels = bright_corpus(workdir / "corpus", count=8)
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods",
                 "minmax", "--allow-short", "--no-progress"]) == 0
    return workdir


def test_the_search_from_python_gives_the_command_lines_answer(calibrated, capsys):
    from quantbench.cli import main

    done = quantbench.search("static-minmax", Fleet("x86"), budget=0, space="global")
    assert done.passed and done.variant and done.stop.startswith("done: ")
    table = done.candidates()
    assert table.column_names[:4] == ["choice", "exclude", "variant_id", "stage"]
    assert table.num_rows >= 1 and table.column("choice").to_pylist()[0] == "base"
    result = json.loads(open(done.result.result_file).read())
    assert [r["variant_id"] for r in result["tried"]] == table.column("variant_id").to_pylist()
    assert done.report.is_file() and "## Ship search" in done.report.read_text()
    capsys.readouterr()
    assert main(["search", "--variant", "static-minmax", "--hosts", "x86", "--space", "global",
                 "--no-progress"]) == (0 if done.written else 1)
    assert f"chosen: {done.variant} " in capsys.readouterr().out


def test_its_errors_name_parameters(calibrated):
    with pytest.raises(UserError, match=r"^budget: must be 0 or more flips \(got -1\)"):
        quantbench.search("static-minmax", Fleet("x86"), budget=-1)
    with pytest.raises(UserError, match=r"^budget='150%': a share of the served decisions is between 0% and 100%"):
        quantbench.search("static-minmax", Fleet("x86"), budget="150%")
    with pytest.raises(UserError, match=r"^variant .*m\.onnx: not a variant of a variants folder calibrate wrote"):
        quantbench.search(os.fspath(calibrated / "m.onnx"), Fleet("x86"))


@pytest.mark.parametrize("call, message", [
    (lambda: quantbench.search(None, "x86"), "fleet='x86': must be a quantbench.Fleet, e.g. Fleet('x86,x86-avx2')"),
    (lambda: quantbench.search(3, Fleet("x86")), "variant=3: must be a variant name or an .onnx path"),
    (lambda: quantbench.search(None, Fleet("x86"), results="other"), "results='other': must be a quantbench.Results"),
    (lambda: quantbench.search(None, Fleet("x86"), budget="0"), "budget='0': must be a whole number"),
    (lambda: quantbench.search(None, Fleet("x86"), budget=None), "budget: must be a whole number"),
    (lambda: quantbench.search(None, Fleet("x86"), budget=0.5), "budget=0.5: must be a whole number"),
    (lambda: quantbench.search(None, Fleet("x86"), jobs=2.5), "jobs=2.5: must be a whole number"),
    (lambda: quantbench.search(None, Fleet("x86"), max_evaluations=float("nan")),
     "max_evaluations=nan: must be a whole number"),
    (lambda: quantbench.search(None, Fleet("x86"), max_evaluations=True), "max_evaluations=True: must be a whole"),
    (lambda: quantbench.search(None, Fleet("x86"), screen_fixtures=float("nan")),
     "screen_fixtures=nan: must be a whole number"),
    (lambda: quantbench.search(None, Fleet("x86"), max_seconds=float("nan")), "max_seconds=nan: must be a finite"),
    (lambda: quantbench.search(None, Fleet("x86"), max_float_share="0.5"), "max_float_share='0.5': must be a fin"),
    (lambda: quantbench.search(None, Fleet("x86"), max_latency_ms=float("inf")), "max_latency_ms=inf: must be a"),
    (lambda: quantbench.search(None, Fleet("x86"), name="../x"), "name: '../x' is not a plain variant name"),
    (lambda: quantbench.search(None, Fleet("x86"), name=""), "name: '' is not a plain variant name"),
])
def test_a_wrong_type_or_value_is_a_parameter_error_before_anything_runs(workdir, call, message):
    """The issue's probes (search(None, 'x86') was an AttributeError, budget='0' a TypeError, max_evaluations=nan
    turned the evaluation budget off): the ParameterError the command line's flag would give, nothing written."""
    from quantbench.errors import ParameterError

    with pytest.raises(ParameterError) as exc:
        call()
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)
    assert list(workdir.iterdir()) == []


def test_the_callers_root_logger_and_threads_are_as_they_were_after_a_search(calibrated):
    """After quantbench.search(...) the caller's root logger had a stderr handler (the quantizer's logging.warning()
    called basicConfig), and the thread that started the workers stayed. Run in a process of its own: pytest's
    log capture gives the root logger handlers of its own."""
    import subprocess
    import sys

    probe = ("import logging, threading\n"
             "import quantbench\n"
             "from quantbench import Fleet\n"
             "for _ in range(2):\n"
             "    quantbench.search('static-minmax', Fleet('x86'), space='global', screen_fixtures=1)\n"
             "    print(logging.getLogger().handlers, sorted(t.name for t in threading.enumerate()))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=calibrated, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["[] ['MainThread']"] * 2, proc.stdout


def test_a_search_with_no_answer_carries_the_commands_outcome(workdir):
    """The near-tie classifier: every int8 form of its one MatMul flips, and keeping it in float leaves no int8 (the
    fp32 baseline, not an answer): not passed, nothing written, the nearest candidate and the stop line as the
    command gives them."""
    from explain_helpers import bright_corpus, near_tie_image_model
    from quantbench.cli import main

    model = near_tie_image_model(workdir / "m.onnx")
    (workdir / "m.json").write_text(json.dumps({"decode": {"kind": "classifier-softmax", "logits": "logits"}}))
    labels = bright_corpus(workdir / "corpus", count=8)
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods",
                 "minmax", "--allow-short", "--no-progress"]) == 0
    done = quantbench.search("static-minmax", Fleet("x86"), space="nodes")
    assert not done.passed and done.written is None and done.variant is None
    assert done.nearest["choice"] == "base" and done.nearest["flips"] == {"x86": 4}
    assert done.nearest["change"] == ["a budget of 4 flips per host",
                                      "the whole space (global choices and nodes kept in float)"]
    assert done.stop.startswith("stopped: space exhausted (")
    outcome = done.outcome()
    assert outcome["passed"] is False and outcome["nearest"] == done.nearest and outcome["stop"] == done.stop
