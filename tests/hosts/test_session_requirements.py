"""A variant whose recipe records a session requirement (session_requirements, as a recipe search writes it) runs
with it on every host: its results equal remedy's x64quantprecision row (the same model under that session entry),
never the baseline's where the entry changes the bytes, and a cached run without it is never reused for it. A host
that cannot apply it (its onnxruntime cannot make the session, its own session says otherwise) is a result saying
so: NOT RUN, with the reason, never run without it."""

from __future__ import annotations

import json

import pytest

from quantbench.cli import main
from quantbench.store.hostresults import load_outputs
from requirement_helpers import X64, add_required_copy, bright_images, hashes, variants_folder
from setup_required import need_tier

COMMON = ["--fixtures", "labels.json", "--no-progress", "--no-plots"]


def _x64_row_entries() -> dict:
    """The session entries of remedy's x64quantprecision row."""
    from quantbench.explain.remedy import build_remedies

    (rv,) = build_remedies("base.onnx", "fp32.onnx", "remedies", remedies=("x64quantprecision",))
    return rv.config_entries


def _saturates_here() -> bool:
    """Whether this process's own CPU takes onnxruntime's saturating U8S8 path (then x64quantprecision changes the
    int8 bytes on the local host too)."""
    from quantbench.analysis.tiers import int8_path
    from quantbench.hosts.masked import here_features

    return int8_path("x86", "x86_64", here_features()).kind == "saturates"


@pytest.mark.slow
def test_every_run_applies_the_requirement_and_equals_the_x64quantprecision_row(workdir, capsys):
    need_tier("x86-avx2")
    bright_images(workdir)
    variants_folder(workdir, "plain", None)
    variants_folder(workdir, "required", X64)
    hosts = ["--hosts", "x86,x86-avx2"]
    assert main(["equiv", *hosts, "--variants", "variants/plain", *COMMON]) == 0          # the baseline, cached
    entries = _x64_row_entries()
    assert main(["run", *hosts, "--variants", "variants/plain", "--fixtures", "labels.json", "--no-progress",
                 *[a for k, v in entries.items() for a in ("--session-config", f"{k}={v}")]]) == 0
    capsys.readouterr()
    assert main(["equiv", *hosts, "--variants", "variants/required", *COMMON]) == 0
    out = capsys.readouterr().out
    root = workdir / "results" / "tables"
    for host in ("x86", "x86-avx2"):
        required = hashes(root, host, "static-minmax", "required")
        assert len(required) == 4, host      # run under the requirement: the cached baseline was not reused
        assert required == hashes(root, host, "static-minmax", "session"), host
        differs = required != hashes(root, host, "static-minmax", "baseline")
        assert differs == (host == "x86-avx2" or _saturates_here()), host
    verdict = next(ln for ln in out.splitlines() if ln.startswith("- ") and " static-minmax:" in ln)
    assert "Deployment requirement: session config session.x64quantprecision=1" in verdict
    summary = json.loads((workdir / "results" / "equiv.json").read_text())
    by = {v["variant"]: v for v in summary["variants"]}
    assert by["static-minmax"]["session_requirements"] == X64 and by["fp32"]["session_requirements"] == {}
    report = (workdir / "results" / "report.md").read_text()
    assert "### Deployment requirements" in report
    assert "- **static-minmax**: session config session.x64quantprecision=1, applied in every run of it" in report
    assert "- **fp32**: none (each host's own session)" in report


def _static_rows(workdir) -> list:
    t = load_outputs(tensors=False, tables_root=workdir / "results" / "tables").to_pylist()
    return [r for r in t if r["variant"] == "static-minmax"]


def test_a_host_onnxruntime_cannot_apply_it_on_is_not_run(workdir, capsys):
    """onnxruntime 1.32 cannot make the session of a static QDQ model with a shared int8 weight under
    session.x64quantprecision=1 where its S8-to-U8 transformer applies (AVX2 and up; SSE4.2 builds it, as
    tests/explain/test_remedy.py shows): that host's result is NOT RUN with onnxruntime's reason."""
    from quantbench.hosts.masked import here_features

    bright_images(workdir)
    variants_folder(workdir, "shared", X64, shared=True)
    capsys.readouterr()
    assert main(["equiv", "--hosts", "x86", "--variants", "variants/shared", *COMMON]) == 0
    out = capsys.readouterr().out
    summary = json.loads((workdir / "results" / "equiv.json").read_text())
    if "avx2" not in here_features():
        assert summary["cannot_run"] == {} and len(_static_rows(workdir)) == 4
        return
    why = summary["cannot_run"]["x86"]["static-minmax"]
    assert why.startswith("session requirement session.x64quantprecision=1 not applied: ")
    assert "Attempt to replace the existing tensor" in why and "\n" not in why
    assert _static_rows(workdir) == []    # never run without it
    assert "- NOT RUN static-minmax: no host's runtime can run it" in out
    assert "NOT RUN on x86 (the host cannot apply it)" in out


def test_a_host_whose_session_contradicts_it_is_not_run(workdir, capsys):
    bright_images(workdir)
    variants_folder(workdir, "required", X64)
    capsys.readouterr()
    assert main(["run", "--hosts", "x86", "--variants", "variants/required", "--fixtures", "labels.json",
                 "--no-progress"]) == 0
    assert ("session requirement sat/static-minmax: session.x64quantprecision=1, added to every host's session for "
            "it") in capsys.readouterr().out.splitlines()
    assert len(_static_rows(workdir)) == 4
    (workdir / "results").rename(workdir / "first-run")
    assert main(["equiv", "--hosts", "x86", "--variants", "variants/required", "--session-config",
                 "session.x64quantprecision=0", *COMMON]) == 0
    out = capsys.readouterr().out
    why = json.loads((workdir / "results" / "equiv.json").read_text())["cannot_run"]["x86"]["static-minmax"]
    assert why == ("session requirement session.x64quantprecision=1 not applied: its session sets "
                   "session.x64quantprecision=0; the variant requires session.x64quantprecision=1")
    assert _static_rows(workdir) == []
    assert "- NOT RUN static-minmax" in out


def test_a_gate_fails_on_a_variant_no_host_can_run(workdir, capsys):
    """`--gate decision` cannot pass on a variant never run: exit 1 naming it, the report still written."""
    bright_images(workdir)
    variants_folder(workdir, "required", X64)
    capsys.readouterr()
    rc = main(["equiv", "--hosts", "x86", "--variants", "variants/required", "--session-config",
               "session.x64quantprecision=0", "--gate", "decision", *COMMON])
    out, err = capsys.readouterr()
    assert rc == 1
    assert err.strip().splitlines()[-1] == ("quantbench equiv: gate failed: decision: static-minmax was never run: "
                                            "no host's runtime can run it")
    assert "- NOT RUN static-minmax: no host's runtime can run it (named under the classes); gate decision: FAIL " \
           "(never run)" in out
    assert (workdir / "results" / "report.md").is_file() and _static_rows(workdir) == []


def test_one_model_with_and_without_a_requirement_is_two_variants_of_one_run(workdir, capsys):
    """The search's answer can be the base's model plus a session entry (static-minmax-x64quantprecision): the
    same bytes, another deployment. Its variant_id is the identity of (semantic hash, requirement), so a plain
    equiv of the folder runs both, each with its own results, classes and decisions, and a rerun is cached."""
    from quantbench.inputs.modelio import semantic_sha256
    from quantbench.inputs.sidecarfile import variant_identity
    from quantbench.store import partread

    bright_images(workdir)
    vdir = variants_folder(workdir, "both", None)
    add_required_copy(vdir, "static-minmax-x64quantprecision", X64)
    add_required_copy(vdir, "static-minmax-copy", {})    # the same bytes without a requirement: still a duplicate
    capsys.readouterr()
    equiv = ["equiv", "--hosts", "x86", "--variants", "variants/both", *COMMON]
    assert main(equiv) in (0, 1)
    captured = capsys.readouterr()
    assert "same model under different session requirements" not in captured.err + captured.out
    sem = semantic_sha256(vdir / "static-minmax.onnx")
    ids = {"fp32": semantic_sha256(vdir / "fp32.onnx"), "static-minmax": sem,
           "static-minmax-x64quantprecision": variant_identity(sem, X64)}
    assert ids["static-minmax-x64quantprecision"] != sem
    summary = json.loads((workdir / "results" / "equiv.json").read_text())
    assert {v["variant"]: v["variant_id"] for v in summary["variants"]} == ids
    assert [(d["name"], d["duplicate_of"]) for d in summary["settings"]["duplicates"]] == [
        ("static-minmax-copy", "static-minmax")]
    root = workdir / "results" / "tables"
    outputs = load_outputs(tensors=False, tables_root=root).to_pylist()
    for name, vid in ids.items():
        rows = [r for r in outputs if r["variant"] == name]
        assert len(rows) == 4 and {r["variant_id"] for r in rows} == {vid}, name
        assert any(r["variant_id"] == vid for r in partread.read("classes", root=root).to_pylist()), name
        assert sum(r["variant_id"] == vid for r in partread.read("decisions", root=root).to_pylist()) >= 4, name
    required = {r["variant"]: "required_entries" in r["session_options"] for r in outputs}
    assert required == {"fp32": False, "static-minmax": False, "static-minmax-x64quantprecision": True}
    models = {r["variant"]: r for r in partread.read("models", root=root).to_pylist()}
    assert models["static-minmax-x64quantprecision"]["semantic_sha256"] == sem
    assert models["static-minmax"]["variant_id"] == models["static-minmax"]["semantic_sha256"] == sem
    verdicts = [ln for ln in captured.out.splitlines() if ln.startswith("- ")]
    assert any(" static-minmax-x64quantprecision:" in ln for ln in verdicts), captured.out
    assert any(" static-minmax:" in ln for ln in verdicts), captured.out
    assert main(equiv) in (0, 1)
    again = json.loads((workdir / "results" / "equiv.json").read_text())
    assert again["variants"] == summary["variants"] and again["equiv_id"] == summary["equiv_id"]
    assert len(load_outputs(tensors=False, tables_root=root).to_pylist()) == len(outputs)   # nothing re-run


def test_an_imported_host_brings_its_results_under_the_requirement(workdir, capsys):
    """An air-gapped machine runs the variant (with its requirement) and exports; the workbench imports the file:
    the imported results are the variant's (under the requirement) and sit in its classes with the local host."""
    bright_images(workdir)
    variants_folder(workdir, "required", X64)
    run = ["--variants", "variants/required", "--fixtures", "labels.json", "--no-progress"]
    assert main(["run", "--hosts", "x86", "--tables", "far", "--export", "far.qbr", *run]) == 0
    (workdir / "hosts.toml").write_text('airgap = { kind = "imported", file = "far.qbr" }\n')
    capsys.readouterr()
    assert main(["equiv", "--hosts", "x86,airgap", "--hosts-file", "hosts.toml", *run, "--no-plots"]) == 0
    summary = json.loads((workdir / "results" / "equiv.json").read_text())
    (v,) = [v for v in summary["variants"] if v["variant"] == "static-minmax"]
    assert [c["hosts"] for c in v["classes"]] == [["x86", "airgap"]] and summary["cannot_run"] == {}
    root = workdir / "results" / "tables"
    assert hashes(root, "airgap", "static-minmax", "required") == hashes(root, "x86", "static-minmax", "required")
    assert len(hashes(root, "airgap", "static-minmax", "required")) == 4
