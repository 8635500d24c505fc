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
    with pytest.raises(UserError, match=r"m\.onnx: no labels recorded with this model .*; pass fixtures LABELS images DIR, or recalibrate$"):
        quantbench.search(os.fspath(calibrated / "m.onnx"), Fleet("x86"))


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
