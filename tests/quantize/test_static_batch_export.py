"""A static-batch export (PyTorch 1.2: input declared [10, 3, 32, 32], initializers listed as graph inputs) is
calibrated as it is: the sidecar's 'shape' overrides the declared dims in every variant (and so on every host), the
recipe records it, a shape it cannot take is refused before any work, and a failed calibrate leaves nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from calib_helpers import make_corpus, static_batch_model
from quantbench.store import partread
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.inputs.modelio import declared_dims
from quantbench.inputs.preprocess import input_spec
from quantbench.quantize import smoke
from quantbench.inputs.variantdir import latest_variants

REPO = str(Path(__file__).resolve().parents[2])
SIDE_48 = {"input": {"name": "input.1", "shape": [1, 3, 48, 48], "scale": 1 / 255}}


@pytest.fixture
def corpus(workdir):
    labels, _ = make_corpus(workdir / "corpus", n_litter=12, n_negative=12, n_eval=4, size=40)
    return labels


def _err(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.replace("\r", "\n").splitlines() if ln.startswith("quantbench")]


def _left(workdir) -> list[str]:
    return sorted(p.name for p in workdir.iterdir() if p.name not in ("corpus", "models"))


def test_a_static_batch_without_a_sidecar_shape_is_refused_before_any_work_naming_the_key(workdir, corpus, capsys):
    model = static_batch_model(workdir / "models" / "net.onnx")
    assert main(["calibrate", "--model", str(model), "--labels", str(corpus), "--per-cell", "3"]) == 2
    lines = _err(capsys)
    assert len(lines) == 1, lines
    assert str(model) in lines[0] and "static batch of 10" in lines[0]
    assert '"shape": [1, 3, 32, 32]' in lines[0] and "sidecar's input block" in lines[0]
    assert _left(workdir) == []     # no calibration set, no results folder


def test_a_sidecar_shape_of_another_rank_is_refused_with_both_shapes():
    side = {"input": {"shape": [1, 3, 32], "plugin": "prep.py:fn"}}   # a plug-in may make any rank
    with pytest.raises(UserError) as exc:
        input_spec(side, [10, 3, 32, 32], "input.1", source="net.onnx", override=True)
    assert "4 dims [10, 3, 32, 32]" in str(exc.value) and "'shape' [1, 3, 32] has 3" in str(exc.value)


def test_later_commands_refuse_a_shape_that_differs_from_the_declared_one():
    with pytest.raises(UserError) as exc:
        input_spec(SIDE_48, [10, 3, 32, 32], "input.1", source="net.onnx")
    assert "[10, 3, 32, 32]" in str(exc.value) and "calibrate this model with that sidecar" in str(exc.value)


def test_the_sidecar_shape_overrides_the_declared_dims_in_every_variant_and_host(workdir, corpus, capsys):
    model = static_batch_model(workdir / "models" / "net.onnx", sidecar=SIDE_48)
    assert main(["calibrate", "--model", str(model), "--labels", str(corpus), "--per-cell", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "declared [10, 3, 32, 32], run as [1, 3, 48, 48]" in out and "out [10, 2] -> [1, 2]" in out
    vs = latest_variants()
    assert [v.name for v in vs] == ["fp32", "dynamic", "static-minmax", "static-percentile"]
    x = np.random.default_rng(0).random((1, 3, 48, 48), dtype=np.float32)
    for v in vs:
        m = onnx.load(str(v.path))
        assert declared_dims(m.graph.input[0]) == [1, 3, 48, 48], v.name
        assert declared_dims(m.graph.output[0]) == [1, 2], v.name
        rec = v.recipe["input_shape_override"]
        assert rec["declared"] == [10, 3, 32, 32] and rec["used"] == [1, 3, 48, 48]
        assert rec["outputs"] == {"out": {"declared": [10, 2], "used": [1, 2]}}
        assert v.recipe["preprocess"]["shape"] == [1, 3, 48, 48]
        y = ort.InferenceSession(str(v.path), providers=["CPUExecutionProvider"]).run(None, {"input.1": x})[0]
        assert y.shape == (1, 2)
    assert main(["run", "--hosts", "x86", "--fixtures", str(corpus), "--no-progress"]) == 0
    outputs = partread.read("outputs").to_pylist()
    assert {"fp32", "dynamic", "static-minmax"} <= {r["variant"] for r in outputs}   # (byte-duplicates run once)
    assert {tuple(r["shape"]) for r in outputs} == {(1, 2)}


def test_a_shape_the_graph_cannot_run_at_is_refused_before_any_work_with_onnxruntimes_whole_message(
        workdir, corpus, capsys):
    side = {"input": {"name": "input.1", "shape": [1, 3, 32, 32]}}
    model = static_batch_model(workdir / "models" / "net.onnx", fixed_reshape=True, sidecar=side)
    assert main(["calibrate", "--model", str(model), "--labels", str(corpus), "--per-cell", "3"]) == 2
    lines = _err(capsys)
    assert len(lines) == 1, lines
    assert str(model) in lines[0] and "[10, 3, 32, 32]" in lines[0] and "'shape' [1, 3, 32, 32]" in lines[0]
    assert "Reshape" in lines[0] or "reshape" in lines[0]
    assert _left(workdir) == []


def test_onnxruntimes_message_keeps_the_lines_that_hold_the_numbers(tmp_path):
    model = static_batch_model(tmp_path / "net.onnx")
    why = smoke.runs(model.read_bytes(), {"input.1": np.zeros((1, 3, 32, 32), np.float32)})
    assert "Got invalid dimensions for input: input.1" in why
    assert "index: 0 Got: 1 Expected: 10" in why and "\n" not in why


def test_a_calibrate_that_fails_after_the_calibration_set_leaves_nothing(workdir, corpus, capsys):
    model = static_batch_model(workdir / "models" / "net.onnx", sidecar=SIDE_48)
    rc = main(["calibrate", "--model", str(model), "--labels", str(corpus), "--per-cell", "3",
               "--exclude-nodes", "no-such-node", "--no-progress"])
    assert rc == 2
    assert "no-such-node" in " ".join(_err(capsys))
    assert _left(workdir) == []   # calib_sets/<name>/ was written before the variants failed: removed with them


def test_a_failure_keeps_a_calibration_set_an_earlier_run_wrote(workdir, corpus, capsys):
    model = static_batch_model(workdir / "models" / "net.onnx", sidecar=SIDE_48)
    args = ["calibrate", "--model", str(model), "--labels", str(corpus), "--per-cell", "3", "--methods", "minmax",
            "--no-progress"]
    assert main(args) == 0
    before = sorted(p.relative_to(workdir).as_posix() for p in (workdir / "calib_sets").rglob("*"))
    assert main([*args, "--exclude-nodes", "no-such-node", "--out", "other"]) == 2
    assert sorted(p.relative_to(workdir).as_posix() for p in (workdir / "calib_sets").rglob("*")) == before
    assert not (workdir / "other").exists()


def test_onnxruntimes_initializer_warnings_all_go_through_the_one_counter(workdir, corpus):
    model = static_batch_model(workdir / "models" / "net.onnx", sidecar=SIDE_48)
    env = {k: v for k, v in os.environ.items() if k != "QUANTBENCH_NO_FD_CAPTURE"}
    proc = subprocess.run([sys.executable, "-m", "quantbench", "calibrate", "--model", str(model), "--labels",
                           str(corpus), "--per-cell", "3", "--methods", "minmax", "--no-progress"],
                          capture_output=True, text=True, timeout=600, cwd=workdir, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "appears in graph inputs" not in proc.stderr
    assert "onnxruntime:" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith("warnings from onnxruntime (-v to show)") and int(last.split()[0]) >= 4, proc.stderr
    verbose = subprocess.run([sys.executable, "-m", "quantbench", "calibrate", "--model", str(model), "--labels",
                              str(corpus), "--per-cell", "3", "--methods", "minmax", "--no-progress", "-v"],
                             capture_output=True, text=True, timeout=600, cwd=workdir, env=env)
    assert verbose.returncode == 0 and "appears in graph inputs" in verbose.stderr
