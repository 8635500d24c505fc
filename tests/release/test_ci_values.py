"""`quantbench ci` writes a workflow only from values it can write literally: no `${{ ... }}` (GitHub would evaluate it
before the shell runs: script injection), a gate equiv takes, a limit of at least one image, a bounded number of
shard jobs, and an --out that is a folder whose files are files. Each refusal is one line, exit 2, nothing written."""

from __future__ import annotations

import pytest

from ci_helpers import actionlint
from cli_helpers import digest
from quantbench.cli import main
from quantbench.hosts.keys import local_ort_version
from quantbench.release.ci import CIParams, github_workflow

INJECT = "${{ github.event.head_commit.message }}"


def _refused(capsys, workdir, argv, words, rc=2):
    before = digest(workdir)
    try:
        got = main(["ci", *argv])
    except SystemExit as exc:
        got = exc.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert got == rc, err
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    assert digest(workdir) == before, "something was written"
    return lines[0]


@pytest.mark.parametrize("argv, flag", [
    (["--calibrate", f"--model m.onnx --labels {INJECT}"], "--calibrate"),
    (["--fixtures", f"l{INJECT}.json", "--images", "im"], "--fixtures"),
    (["--fixtures", "l.json", "--images", f"im{INJECT}"], "--images"),
    (["--install", f".[plots]{INJECT}"], "--install"),
    (["--gate", f"decision{INJECT}"], "--gate"),
    (["--runners", f"ubuntu-24.04{INJECT}=gh-x86"], "--runners"),
    (["--onnxruntime", f"1.2{INJECT}"], "--onnxruntime"),
    (["--python", f"3.11{INJECT}"], "--python"),
    (["--variants", f"models/{INJECT}"], "--variants"),
    (["--split", f"eval{INJECT}"], "--split"),
])
def test_an_expression_in_any_value_is_refused(workdir, capsys, argv, flag):
    line = _refused(capsys, workdir, argv, "${{")
    assert f"quantbench ci: error: {flag} " in line and "GitHub Actions would evaluate it" in line


def test_the_library_names_the_parameter(workdir):
    p = CIParams(onnxruntime=local_ort_version(), install=f"x{INJECT}")
    with pytest.raises(Exception) as exc:
        github_workflow(p)
    assert str(exc.value).startswith("install=") and "--" not in str(exc.value)


def test_a_dollar_written_literally_still_lints(workdir):
    """What is refused is the expression opener; a shell `$` in a value stays quoted in the script and lints."""
    p = CIParams(onnxruntime=local_ort_version(), emulated=[], install=".[plots]", gate="decision",
                 calibrate=["--model", "m$HOME.onnx"])
    (workdir / "wf.yml").write_text(github_workflow(p))
    assert actionlint(workdir / "wf.yml") == []
    assert "'m$HOME.onnx'" in (workdir / "wf.yml").read_text()


def test_an_unknown_gate_is_refused_when_the_workflow_is_written(workdir, capsys):
    line = _refused(capsys, workdir, ["--gate", "decisoin"], "unknown gate decisoin")
    assert "--gate decisoin" in line and "tensor, decision, classes" in line


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_a_limit_below_one_is_refused(workdir, capsys, limit):
    _refused(capsys, workdir, ["--limit", limit], f"--limit {limit}: must be at least 1")


def test_the_limit_reaches_every_job(workdir, capsys):
    assert main(["ci", "--limit", "6", "--hosts", "pi", "--shards", "1"]) == 0
    text = (workdir / "results" / "ci" / "quantbench.yml").read_text()
    assert text.count("--limit 6") == 6   # three shard jobs (two native, one pi), each native job's tier step, the merge


@pytest.mark.parametrize("argv", [["--shards", "100000"], ["--native-shards", "300"], ["--shards", str(10 ** 15)],
                                  ["--hosts", "pi,pi4,pi3,graviton2,graviton3", "--shards", "60"]])
def test_shard_jobs_are_bounded(workdir, capsys, argv):
    line = _refused(capsys, workdir, argv, "shard jobs; a workflow holds at most 256")
    assert "error: --" in line


def test_out_onto_a_file_is_refused(workdir, capsys):
    (workdir / "quantbench.yml").write_text("mine\n")
    _refused(capsys, workdir, ["--out", "quantbench.yml"], "--out quantbench.yml: is a file, not a folder")
    assert (workdir / "quantbench.yml").read_text() == "mine\n"


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_folder_where_the_workflow_goes_is_refused(workdir, capsys, force):
    (workdir / "o" / "quantbench.yml").mkdir(parents=True)
    (workdir / "o" / "quantbench.yml" / "keep").write_text("mine\n")
    _refused(capsys, workdir, ["--out", "o", *force], "o/quantbench.yml: a folder, not a file; nothing was written")
    assert (workdir / "o" / "quantbench.yml" / "keep").read_text() == "mine\n"


def test_the_largest_workflow_is_written_and_the_gitlab_merge_names_no_needs(workdir):
    """256 shard jobs: GitHub's merge needs them all; GitLab's merge runs by stage (a GitLab job names at most 50
    needs), after every shard job, with their artifacts."""
    import yaml

    from quantbench.release.ci import gitlab_ci

    p = CIParams(onnxruntime=local_ort_version(), emulated=["pi", "pi4"], shards=127)
    gh = yaml.safe_load(github_workflow(p))
    assert len(gh["jobs"]["merge"]["needs"]) == 256
    gl = yaml.safe_load(gitlab_ci(p))
    assert "needs" not in gl["merge"] and gl["merge"]["stage"] == "merge" and gl["stages"][-1] == "merge"
    assert all(len(job.get("needs", [])) <= 50 for job in gl.values() if isinstance(job, dict))


@pytest.mark.parametrize("argv, flag", [
    (["--variants", "../../../etc"], "--variants"),
    (["--variants", "/etc"], "--variants"),
    (["--fixtures", "/etc/passwd", "--images", "im"], "--fixtures"),
    (["--fixtures", "l.json", "--images", "/"], "--images"),
    (["--fixtures", "l.json", "--images", "im/../.."], "--images"),
])
def test_a_path_outside_the_checkout_is_refused(workdir, capsys, argv, flag):
    """The prepare job copies these into the artifact every job downloads: `cp -r / qb-inputs/images` would ship
    the runner's whole disk."""
    line = _refused(capsys, workdir, argv, "must be a path inside the repository's checkout")
    assert f"quantbench ci: error: {flag} " in line


def test_a_link_out_of_the_checkout_is_refused(workdir, capsys):
    (workdir / "models").symlink_to("/etc")
    _refused(capsys, workdir, ["--variants", "models"], "--variants models: must be a path inside the repository")


def test_a_path_inside_the_checkout_is_written(workdir, capsys):
    (workdir / "models").mkdir()
    assert main(["ci", "--variants", "models", "--fixtures", "data/l.json", "--images", "data/im"]) == 0
    text = (workdir / "results" / "ci" / "quantbench.yml").read_text()
    assert "cp -r models qb-inputs/variants" in text and "cp data/l.json qb-inputs/labels.json" in text


@pytest.mark.parametrize("argv, words", [
    (["--runners", ","], "--runners : names no native runner"),
    (["--gate", ""], "--gate : names no gate"),
    (["--gate", ","], "--gate ,: names no gate"),
    (["--out", ""], "--out : is empty"),
    (["--calibrate", "--model 'x"], "--calibrate --model 'x: not a shell argument list (No closing quotation)"),
])
def test_an_empty_or_unparsable_value_is_refused(workdir, capsys, argv, words):
    _refused(capsys, workdir, argv, words)


def test_out_over_a_dangling_link_is_refused(workdir, capsys):
    (workdir / "o6").symlink_to(workdir / "gone")
    _refused(capsys, workdir, ["--out", "o6"], "--out o6: is a symbolic link to nothing; nothing was written")
    assert not (workdir / "gone").exists()


def test_a_dangling_workflow_link_is_replaced_only_with_force(workdir, capsys):
    (workdir / "o").mkdir()
    (workdir / "o" / "quantbench.yml").symlink_to(workdir / "gone.yml")
    _refused(capsys, workdir, ["--out", "o"], "o/quantbench.yml: exists; nothing was written")
    assert main(["ci", "--out", "o", "--force"]) == 0
    assert not (workdir / "o" / "quantbench.yml").is_symlink() and not (workdir / "gone.yml").exists()
