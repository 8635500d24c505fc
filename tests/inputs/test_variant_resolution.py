"""Which variants a command runs: the latest calibrate output, never a silent stand-in.

A damaged variants folder stops the command with one line naming the file (the bundled
demo models are used only when no calibrate output exists at all, and the run says so
first); a variant whose model no longer has the semantic hash its recipe records (an
edited initializer, another variant's file copied over it) is refused before it runs.
Each refusal: exit 2, one `quantbench <command>: error:` line, no traceback, nothing
written in the working folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from calib_helpers import make_corpus, tiny_model
from quantbench.cli import main
from cli_helpers import digest, one_line


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A working folder after `calibrate` of a user's (tiny) model: fp32, dynamic, static-minmax."""
    wd = tmp_path_factory.mktemp("calibrated")
    with _cwd(wd):
        labels, _ = make_corpus(wd / "corpus", n_litter=4, n_negative=4, n_eval=2)
        model = tiny_model(wd / "models" / "mine.onnx")
        assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2",
                     "--no-pre-process", "--methods", "dynamic,minmax", "--no-progress"]) == 0
    return wd


@pytest.fixture
def wd(calibrated, tmp_path, monkeypatch):
    """A fresh copy of the calibrated working folder, as the current folder."""
    monkeypatch.chdir(shutil.copytree(calibrated, tmp_path / "w", symlinks=True))
    return tmp_path / "w"


def _refused(capsys, wd: Path, args, *expect: str, command: str = "equiv") -> str:
    capsys.readouterr()
    before = digest(wd)
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    line = one_line(err, command)
    assert rc == 2, err
    for e in expect:
        assert e in line, line
    assert "litter-cnn" not in out + err and "litter-detr-tiny" not in out + err
    assert digest(wd) == before, "something was written"
    return line


VDIR = Path("results/variants/mine")


def _truncate(p: Path) -> None:
    p.write_text(p.read_text()[:7])


DAMAGE = {
    "variant file deleted": (lambda: (VDIR / "dynamic.onnx").unlink(), "dynamic.onnx", "missing"),
    "recipe deleted": (lambda: (VDIR / "static-minmax.recipe.json").unlink(), "static-minmax.recipe.json",
                       "not found"),
    "latest.json truncated": (lambda: _truncate(Path("results/variants/latest.json")), "latest.json", "JSON"),
    "index entry without a name": (lambda: (VDIR / "index.json").write_text(json.dumps([{"file": 5}])),
                                   "index.json", "without name"),
    "latest.json deleted": (lambda: Path("results/variants/latest.json").unlink(), "latest.json", "mine"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_variants_folder_is_refused_not_swapped_for_the_demo(wd, capsys, case):
    damage, names, words = DAMAGE[case]
    damage()
    _refused(capsys, wd, ["equiv", "--hosts", "x86", "--gate", "decision", "--no-progress"], names, words)


def test_run_refuses_a_damaged_variants_folder_too(wd, capsys):
    (VDIR / "dynamic.onnx").unlink()
    _refused(capsys, wd, ["run", "--hosts", "x86", "--no-progress"], "dynamic.onnx", "missing", command="run")


def test_demo_is_used_only_without_any_calibrate_output_and_says_so(workdir, capsys):
    from quantbench.inputs.variantdir import DEMO_NOTE

    assert main(["equiv", "--hosts", "x86", "--limit", "1", "--no-progress", "--no-plots", "--json"]) == 0
    out, err = capsys.readouterr()
    first = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()][0]
    assert first == DEMO_NOTE and "demo" in first
    assert json.loads(out)["settings"]["variants"]  # stdout stays pure JSON
    assert DEMO_NOTE in (workdir / "results" / "report.md").read_text()
    assert main(["equiv", "--hosts", "x86", "--limit", "1", "--no-progress", "--no-plots", "--no-run"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == DEMO_NOTE


# --------------------------------------------------------------------------- semantic hash vs recipe


def _edit_one_int8_initializer(path: Path) -> None:
    import onnx
    from onnx import numpy_helper as nh

    m = onnx.load(str(path))
    init = next(i for i in m.graph.initializer if i.data_type == onnx.TensorProto.INT8 and np.prod(i.dims) > 1)
    arr = nh.to_array(init).copy()
    arr.flat[0] = np.int8(arr.flat[0] + 1 if arr.flat[0] < 127 else arr.flat[0] - 1)
    init.CopyFrom(nh.from_array(arr, init.name))
    onnx.save(m, str(path))


TAMPER = {
    "an int8 initializer edited": lambda: _edit_one_int8_initializer(VDIR / "static-minmax.onnx"),
    "dynamic.onnx copied over it": lambda: shutil.copyfile(VDIR / "dynamic.onnx", VDIR / "static-minmax.onnx"),
}


@pytest.mark.parametrize("case", sorted(TAMPER))
@pytest.mark.parametrize("command", ["equiv", "run"])
def test_a_variant_unlike_its_recipe_is_refused_before_it_runs(wd, capsys, case, command):
    TAMPER[case]()
    line = _refused(capsys, wd, [command, "--hosts", "x86", "--no-progress"], "static-minmax.onnx",
                    "semantic hash", "static-minmax.recipe.json", command=command)
    assert "recalibrate" in line


@pytest.mark.parametrize("command", ["localize", "noise"])
def test_explain_commands_check_the_variant_too(wd, capsys, command):
    TAMPER["an int8 initializer edited"]()
    _refused(capsys, wd, [command, "--variant", "static-minmax", "--hosts", "x86", "--no-progress"],
             "static-minmax.onnx", "semantic hash", command=command)


@pytest.mark.parametrize("args, hashed", [
    (["run", "--hosts", "x86"], 3),  # fp32, dynamic, static-minmax: each hashed once, checked against its recipe
    (["noise", "--variant", "static-minmax", "--hosts", "x86", "--limit", "1", "--factors", "repeat"], 1),
    (["localize", "--variant", "static-minmax", "--hosts", "x86,x86+session.set_denormal_as_zero=1"], 1),
])
def test_untouched_variants_still_run_and_hash_once(wd, capsys, monkeypatch, args, hashed):
    from quantbench.inputs import modelio

    calls = []
    real = modelio.stripped_copy
    monkeypatch.setattr(modelio, "stripped_copy", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert main([*args, "--no-progress"]) == 0, capsys.readouterr().err
    assert len(calls) == hashed


@pytest.mark.parametrize("case", ["latest.json truncated", "recipe deleted"])
def test_explain_commands_name_the_damage_not_a_missing_calibrate_run(wd, capsys, case):
    damage, names, words = DAMAGE[case]
    damage()
    line = _refused(capsys, wd, ["noise", "--variant", "static-minmax", "--hosts", "x86", "--no-progress"], names,
                    words, command="noise")
    assert "no calibrate run yet" not in line


def test_remedy_checks_its_fp32_reference_too(wd, capsys):
    shutil.copyfile(VDIR / "dynamic.onnx", VDIR / "fp32.onnx")
    _refused(capsys, wd, ["remedy", "--variant", "static-minmax", "--hosts", "x86,x86+session.x64quantprecision=1",
                          "--decode", "none", "--no-progress"], "fp32.onnx", "semantic hash", "fp32.recipe.json",
             command="remedy")
