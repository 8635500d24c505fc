"""`quantbench.api.equiv.rerender(...)`: the report the `report` command re-renders from the tables, from Python:
the same analysis and the same report.md for the same results folder."""

from __future__ import annotations

import json

import quantbench
from quantbench import Fleet, Results


def same(rows) -> str:
    """Rows compared as JSON: a flip's nan iou equals itself there."""
    return json.dumps(rows, sort_keys=True, default=str)


def test_rerender_gives_the_report_commands_report(workdir, capsys):
    from explain_helpers import bright_corpus, saturating_image_model, saturating_int8_host
    from quantbench.api.equiv import rerender
    from quantbench.cli import main

    model = saturating_image_model(workdir / "m.onnx")
    (workdir / "m.json").write_text(json.dumps({"decode": {"kind": "classifier-softmax", "logits": "logits"}}))
    labels = bright_corpus(workdir / "corpus", count=6)
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods",
                 "minmax", "--allow-short", "--no-progress"]) == 0
    done = quantbench.equiv(fleet=Fleet(saturating_int8_host()), plots=False)   # a host where the model flips
    report = workdir / "results" / "report.md"
    report.unlink()
    result, files = rerender(Results(), plots=False)
    assert report.is_file() and any(str(f).endswith("report.md") for f in files)
    assert same(result.class_rows) == same(done.analysis.class_rows)
    assert same(result.flip_rows) == same(done.analysis.flip_rows) != "[]"
    ours = report.read_text()
    report.unlink()
    capsys.readouterr()
    assert main(["report", "--no-plots"]) == 0
    assert report.read_text() == ours
