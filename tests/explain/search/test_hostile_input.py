"""The search under hostile or careless input (a careless user's probes): each refused in one line naming the option or
file and the problem, exit 2, before anything runs where it can be told before, and nothing written, left behind
or written outside the results folder."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_helpers import digest, one_line
from quantbench.cli import main
from search_helpers import index_of

SEARCH = ["search", "--variant", "static-minmax", "--hosts", "x86", "--space", "global", "--no-progress"]


def _refused(run_dir, capsys, argv) -> str:
    capsys.readouterr()
    before = digest(run_dir.parent)
    rc = main(argv)
    line = one_line(capsys.readouterr().err, "search")
    assert rc == 2
    assert digest(run_dir.parent) == before, "something was written"
    return line


@pytest.mark.parametrize("name", ["../../../escape", "a/b", ".hidden", "bad\nname", ""])
def test_a_name_that_is_not_a_plain_variant_name_is_refused_before_anything_runs(run_dir, capsys, name):
    line = _refused(run_dir, capsys, [*SEARCH, "--name", name])
    assert f"--name: {name!r} is not a plain variant name" in line
    assert index_of(run_dir) == ["fp32", "static-minmax"]


@pytest.mark.parametrize("flag, value, message", [
    ("--max-seconds", "nan", "--max-seconds nan: must be a finite number"),
    ("--max-float-share", "nan", "--max-float-share nan: must be a finite number"),
    ("--max-latency-ms", "inf", "--max-latency-ms inf: must be a finite number"),
])
def test_a_number_that_is_not_finite_is_refused(run_dir, capsys, flag, value, message):
    assert message in _refused(run_dir, capsys, [*SEARCH, flag, value])


@pytest.mark.parametrize("extra, message", [
    (["--graph-opt", "disabled"], "--graph-opt disabled: a variant cannot record a graph optimization level"),
    (["--graph-opt", "basic"], "--graph-opt basic: a variant cannot record a graph optimization level"),
    (["--session-config", "session.x64quantprecision=1"],
     "--session-config: the search's answer carries only the session entries its variant records; record "
     "'session.x64quantprecision=1' as the variant's session requirement at calibrate"),
    (["--session-config", "session.x64quantprecision=1\nX"],
     "--session-config 'session.x64quantprecision': a config entry is one line"),
    (["--hosts", "x86-avx2+session.x64quantprecision=1"],
     "--hosts: 'x86-avx2+session.x64quantprecision=1': a per-host session override gives one host a session"),
    (["--hosts", "x86,x86-avx2+graph_optimization_level=disabled"],
     "--hosts: 'x86-avx2+graph_optimization_level=disabled': a per-host session override"),
])
def test_a_session_setting_the_answer_would_not_carry_is_refused(run_dir, capsys, extra, message):
    """The issue's probes passed the base "as calibrated" with "session requirements: none" under these, while
    equiv without them counts 4 flips on x86-avx2: an answer holds under the session it was measured in, and a
    variant records config entries only as its session requirement (calibrate's), which the search carries."""
    argv = [*SEARCH, *extra] if extra[0] != "--hosts" else [*SEARCH[:3], *extra, *SEARCH[5:]]
    assert message in _refused(run_dir, capsys, argv)


def test_a_results_folder_option_reads_and_writes_only_that_folder(run_dir, capsys):
    """`--results other` read ./results/variants and wrote its answer there (with only other/: "no variants
    yet"); now the base, its fp32, the state and the answer are all other's."""
    shutil.move(run_dir / "results", run_dir / "other")
    rc = main([*SEARCH[:3], "--hosts", "x86-avx2", "--space", "global", "--name", "answer", "--results", "other",
               "--no-progress"])
    out = capsys.readouterr().out
    assert rc in (0, 1), out
    assert not (run_dir / "results").exists()
    assert (run_dir / "other/search/evaluations.jsonl").is_file()
    if rc == 0:
        assert "answer" in [e["name"] for e in json.loads((run_dir / "other/variants/m/index.json").read_text())]


def test_the_variant_as_its_onnx_path_is_searched_like_its_name(run_dir, capsys):
    """`--help` says a variant name or an .onnx file: a variant's file in a variants folder calibrate wrote is
    taken (its fp32 is the one beside it); a model calibrate did not write is one line."""
    path = run_dir / "results/variants/m/static-minmax.onnx"
    assert main(["search", "--variant", str(path), "--hosts", "x86", "--space", "global", "--no-progress"]) in (0, 1)
    assert "static-minmax" in capsys.readouterr().out
    shutil.copy(path, run_dir / "loose.onnx")
    line = _refused(run_dir, capsys, [*SEARCH[:2], "loose.onnx", *SEARCH[3:]])
    assert "--variant loose.onnx: not a variant of a variants folder calibrate wrote" in line


def test_a_latest_json_naming_a_folder_outside_is_refused(run_dir, capsys, tmp_path_factory):
    """A results folder can bring a latest.json naming any folder: the search wrote its answer and index.json
    there. Now it takes such a folder only by an explicit variant path."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    shutil.copytree(run_dir / "results/variants/m", elsewhere / "m")
    (run_dir / "results/variants/latest.json").write_text(json.dumps({"model": "m", "folder": str(elsewhere / "m")}))
    before = digest(elsewhere)
    line = _refused(run_dir, capsys, SEARCH)
    assert f"results/variants/latest.json: names the variants folder {elsewhere / 'm'}, outside the working folder" \
           in line
    assert digest(elsewhere) == before


def _ranges(run_dir, edit) -> None:
    path = run_dir / "results/variants/m/static-minmax.ranges.json"
    saved = json.loads(path.read_text())
    edit(saved["ranges"])
    path.write_text(json.dumps(saved))


RANGES = "results/variants/m/static-minmax.ranges.json"


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update({"f": [0.0, 8.0], "images": [0.0, 8.0]}),
     f"{RANGES}: not the ranges static-minmax was calibrated with (SHA-256 "),
    (lambda r: r.update({"f": ["a", "b"]}), f"{RANGES}: not a quantbench ranges file ("),
    (lambda r: r.update({"f": [float("nan"), 1.0]}), f"{RANGES}: tensor 'f' has the range [nan, 1.0], not finite"),
    (lambda r: r.clear(), f"{RANGES}: holds no ranges; rerun `quantbench calibrate` to remake it"),
])
def test_the_base_is_re_made_only_from_the_ranges_it_was_calibrated_with(run_dir, capsys, edit, message):
    """Widened ranges passed as "the variant as calibrated" (recipe `choice: base` while static-minmax flips 4);
    string ranges were a ValueError, empty or NaN ones "space exhausted" without a word."""
    _ranges(run_dir, edit)
    assert message in _refused(run_dir, capsys, SEARCH)
    assert index_of(run_dir) == ["fp32", "static-minmax"]


def test_a_prepared_model_that_does_not_remake_the_base_is_one_line(run_dir, capsys):
    """A prepared.onnx with every weight zeroed was searched without a word."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    path = run_dir / "results/variants/m/prepared.onnx"
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
    onnx.save(model, str(path))
    line = _refused(run_dir, capsys, SEARCH)
    assert "results/variants/m/prepared.onnx: static-minmax re-made from it and static-minmax.ranges.json is not " \
           "the variant calibrate wrote (semantic hash " in line


def test_a_second_search_on_a_folder_is_refused_while_one_runs(run_dir, capsys):
    """Two searches at once both ran every evaluation (187 duplicated cache lines): the second is one line."""
    import fcntl

    state = run_dir / "results/search"
    state.mkdir()
    with open(state / ".lock", "a") as held:   # what a running search holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        line = _refused(run_dir, capsys, SEARCH)
    assert f"results/search: another search is running on this results folder; wait for it to end" in line
    assert sorted(p.name for p in state.iterdir()) == [".lock"]


def test_a_killed_searchs_candidates_folder_is_swept_by_the_next(run_dir, capsys):
    """SIGKILL left results/search/.search.* (candidate models, 55 MB after 4 kills) that no rerun swept: the next
    search removes those whose owner process is gone, and never a live search's."""
    import subprocess
    import sys

    from quantbench.fsutil import owner_tag

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = owner_tag().split("@")[1]
    state = run_dir / "results/search"
    stale, live = state / f".search.{dead.stdout.strip()}@{host}.abcd1234.tmp", state / f".search.1@{host}.x1.tmp"
    for folder in (stale, live):
        folder.mkdir(parents=True)
        (folder / "c0.onnx").write_bytes(b"x" * 1000)
    assert main(SEARCH) in (0, 1)
    assert not stale.exists() and live.is_dir()
    assert [p.name for p in state.iterdir() if p.name.startswith(".search.")] == [live.name]


def test_a_state_folder_that_is_a_symlink_is_refused(run_dir, capsys, tmp_path_factory):
    """A results folder shipping results/search as a link: the search wrote through it."""
    target = tmp_path_factory.mktemp("users")
    (run_dir / "results/search").symlink_to(target)
    line = _refused(run_dir, capsys, SEARCH)
    assert "results/search: is a symbolic link or not a folder; the search keeps its state" in line
    assert list(target.iterdir()) == []


def test_an_evaluations_file_that_is_a_symlink_is_refused(run_dir, capsys, tmp_path_factory):
    target = tmp_path_factory.mktemp("users") / "notes.txt"
    target.write_text("mine\n")
    (run_dir / "results/search").mkdir()
    (run_dir / "results/search/evaluations.jsonl").symlink_to(target)
    line = _refused(run_dir, capsys, SEARCH)
    assert "results/search/evaluations.jsonl: is a symbolic link; the search keeps its cache" in line
    assert target.read_text() == "mine\n"


def test_a_calibrate_run_during_the_search_stops_it_before_it_writes(run_dir, calibrated, capsys):
    """`calibrate --force` during a search: the search wrote a recipe naming the old calibration set and base into a
    folder whose static-minmax had been re-made. Now it stops with one line and writes nothing."""
    from quantbench.analysis.decode import spec_for_variant
    from quantbench.errors import UserError
    from quantbench.explain.search import SearchParams, search
    from quantbench.hosts.registry import parse_hosts
    from quantbench.runs.runner import plan_run
    from quantbench.inputs.variantdir import latest_variants

    vs = {v.name: v for v in latest_variants()}
    hosts = parse_hosts("x86-avx2")
    plan = plan_run([h.spec for h in hosts], [vs["static-minmax"]], check_hosts=False)
    recalibrated = []

    def recalibrate(walk, tried):   # after the first stage: another calibration set, other ranges
        if not recalibrated:
            recalibrated.append(main(["calibrate", "--model", str(calibrated / "m.onnx"), "--labels",
                                      str(calibrated / "corpus/labels.json"), "--per-cell", "1", "--methods",
                                      "minmax", "--allow-short", "--force", "--no-progress"]))

    with pytest.raises(UserError, match=r"results/variants/m: static-minmax changed during the search \(a calibrate "
                                        r"run re-made it\); the search measured the one before, so nothing was "
                                        r"written: rerun the search$"):
        search(vs["static-minmax"], vs["fp32"].path, hosts, plan.fixtures_for[plan.variants[0].variant_id],
               spec_for_variant(vs["static-minmax"]), SearchParams(space="global", name="answer"),
               run_dir / "results/search", on_evaluation=recalibrate)
    assert recalibrated == [0]
    assert index_of(run_dir) == ["fp32", "static-minmax"]
    assert not (run_dir / "results/variants/m/answer.onnx").exists()


def test_a_read_only_results_folder_is_one_line_before_any_evaluation(run_dir, capsys):
    """A read-only results folder was an OSError traceback (results/search, its work folder, or the staging folder
    beside the variants after every evaluation ran): now one line naming the folder, before anything runs."""
    import os
    import subprocess

    from setup_required import missing_setup

    results = run_dir / "results"
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", "-o", "ro", str(results), str(results)],
                                           capture_output=True).returncode != 0:
        missing_setup("needs root to bind-mount a read-only results folder (CI runs as root)")
    try:
        line = _refused(run_dir, capsys, SEARCH)
    finally:
        subprocess.run(["umount", str(results)], check=True)
    assert "results/variants/m: cannot write there (Read-only file system); the search writes its answer beside " \
           "the base variant; nothing was run" in line
    assert not (results / "search").exists()


def test_a_lock_file_that_is_a_symlink_is_never_followed(run_dir, capsys, tmp_path_factory):
    target = tmp_path_factory.mktemp("users") / "absent.txt"
    (run_dir / "results/search").mkdir()
    (run_dir / "results/search/.lock").symlink_to(target)
    assert "results/search/.lock: cannot take the search's lock (" in _refused(run_dir, capsys, SEARCH)
    assert not target.exists()
