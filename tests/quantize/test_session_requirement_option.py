"""calibrate --require-session KEY=VALUE (repeatable) records a deployment requirement in the recipes of the
quantized variants it writes (never the fp32 reference's); a key onnxruntime does not know is one line before any
work, nothing written."""

from __future__ import annotations

import json

from calib_helpers import make_corpus, tiny_model
from cli_helpers import one_line
from quantbench.cli import main
from quantbench.inputs.variantdir import load_variants


def test_calibrate_records_the_requirement_in_the_quantized_recipes(workdir, capsys):
    labels, _ = make_corpus(workdir / "corpus", n_litter=12, n_negative=12, n_eval=4)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "3", "--methods",
                 "dynamic,minmax", "--require-session", "session.x64quantprecision=1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    by = {v.name: v for v in load_variants(workdir / "results" / "variants" / "tiny")}
    assert set(by) == {"fp32", "dynamic", "static-minmax"}
    for name in ("dynamic", "static-minmax"):
        recipe = json.loads((workdir / "results" / "variants" / "tiny" / f"{name}.recipe.json").read_text())
        assert recipe["session_requirements"] == {"session.x64quantprecision": "1"}, name
        assert by[name].recipe["session_requirements"] == {"session.x64quantprecision": "1"}
    assert "session_requirements" not in by["fp32"].recipe
    assert "requires session.x64quantprecision=1" in out


def test_a_misspelt_key_is_one_line_before_any_work(workdir, capsys):
    labels, _ = make_corpus(workdir / "corpus", n_litter=4, n_negative=4, n_eval=2)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--require-session",
                 "session.x64quantprecison=1", "--no-progress"]) == 2
    line = one_line(capsys.readouterr().err, "calibrate")
    assert line.endswith("--require-session: onnxruntime has no session config key 'session.x64quantprecison'; "
                         "did you mean session.x64quantprecision?")
    assert not (workdir / "results").exists() and not (workdir / "calib_sets").exists()
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--require-session",
                 "session.x64quantprecision", "--no-progress"]) == 2
    assert "--require-session 'session.x64quantprecision': expected KEY=VALUE" in \
        one_line(capsys.readouterr().err, "calibrate")
