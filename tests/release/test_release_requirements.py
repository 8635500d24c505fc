"""A variant's session requirement travels with the release: release.json names it per variant (and records
each target's session with it), `verify --host` re-runs the variant with it (the baseline's bytes differ, so a PASS
is a re-run under it), and a host that cannot apply it fails the re-run saying why."""

from __future__ import annotations

import json

import pytest

from quantbench.cli import main
from requirement_helpers import X64, bright_images, hashes, variants_folder
from setup_required import need_tier

COMMON = ["--fixtures", "labels.json", "--no-progress", "--no-plots"]


@pytest.mark.slow
def test_release_names_the_requirement_and_verify_reruns_with_it(workdir, capsys):
    need_tier("x86-avx2")
    bright_images(workdir)
    variants_folder(workdir, "plain", None)
    variants_folder(workdir, "required", X64)
    assert main(["equiv", "--hosts", "x86-avx2", "--variants", "variants/plain", *COMMON]) == 0
    assert main(["equiv", "--hosts", "x86-avx2", "--variants", "variants/required", *COMMON]) == 0
    root = workdir / "results" / "tables"
    required = hashes(root, "x86-avx2", "static-minmax", "required")
    assert required and required != hashes(root, "x86-avx2", "static-minmax", "baseline")
    assert main(["release", "--tag", "v1", "--variants", "variants/required", "--results", "results"]) == 0
    folder = workdir / "results" / "releases" / "v1"
    rec = json.loads((folder / "release.json").read_text())
    by = {v["name"]: v for v in rec["variants"]}
    assert by["static-minmax"]["session_requirements"] == X64 and by["fp32"]["session_requirements"] == {}
    (t,) = by["static-minmax"]["targets"]      # the baseline's results of the same model are not this release's
    assert t["session_options"]["config_entries"] == X64 and t["session_options"]["required_entries"] == X64
    report = (folder / "report.md").read_text()
    assert "Deployment requirements:\n\n- fp32: none\n- static-minmax: session.x64quantprecision=1\n" in report
    capsys.readouterr()
    assert main(["verify", str(folder), "--host", "x86-avx2", "--sample", "2"]) == 0
    rerun = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("re-run")]
    assert len(rerun) == 2 and all(" PASS " in ln and "2 fixtures" in ln for ln in rerun), rerun


@pytest.mark.slow
def test_verify_on_a_host_that_cannot_apply_it_fails_saying_why(workdir, capsys):
    """Released from an SSE4.2 machine (onnxruntime 1.32 makes the session of a shared int8 weight under
    session.x64quantprecision=1 there), re-run where the host named alike is an AVX2 one (it cannot)."""
    need_tier("x86-sse4")
    need_tier("x86-avx2")
    bright_images(workdir)
    variants_folder(workdir, "shared", X64, shared=True)
    (workdir / "sse4.toml").write_text('edge = { kind = "masked", profile = "x86-sse4" }\n')
    (workdir / "avx2.toml").write_text('edge = { kind = "masked", profile = "x86-avx2" }\n')
    assert main(["equiv", "--hosts", "edge", "--hosts-file", "sse4.toml", "--variants", "variants/shared",
                 *COMMON]) == 0
    assert len(hashes(workdir / "results" / "tables", "edge", "static-minmax", "required")) == 4
    assert main(["release", "--tag", "v1", "--variants", "variants/shared", "--results", "results"]) == 0
    folder = workdir / "results" / "releases" / "v1"
    capsys.readouterr()
    assert main(["verify", str(folder), "--host", "edge", "--hosts-file", "avx2.toml", "--sample", "2"]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("re-run") and "static-minmax on edge" in ln)
    assert " FAIL " in line and "edge cannot run it: session requirement session.x64quantprecision=1 not applied: " \
                                in line and "Attempt to replace the existing tensor" in line


def _edited_release(workdir, edit) -> list:
    """The exit code of `verify` on a release of the required folder (run on x86) after `edit(record)`."""
    bright_images(workdir)
    variants_folder(workdir, "required", X64)
    assert main(["equiv", "--hosts", "x86", "--variants", "variants/required", *COMMON]) in (0, 1)
    assert main(["release", "--tag", "v1", "--variants", "variants/required", "--results", "results"]) == 0
    folder = workdir / "results" / "releases" / "v1"
    rec = json.loads((folder / "release.json").read_text())
    edit(next(v for v in rec["variants"] if v["name"] == "static-minmax"))
    (folder / "release.json").write_text(json.dumps(rec))
    return main(["verify", str(folder), "--no-registry"])


def test_an_edited_requirement_in_the_record_fails_verify(workdir, capsys):
    def drop(v):
        v["session_requirements"] = {}

    assert _edited_release(workdir, drop) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines()
                if ln.startswith("artifact") and "static-minmax" in ln)
    assert " FAIL " in line and "recorded session requirement none is not its recipe's " \
                                "(session.x64quantprecision=1)" in line, line


def test_a_requirement_edited_in_record_and_recipe_alike_fails_verify(workdir, capsys):
    """The results were keyed by the model under its requirement: another requirement is another variant_id."""
    def other(v):
        v["session_requirements"] = v["recipe"]["session_requirements"] = {"session.x64quantprecision": "0"}

    assert _edited_release(workdir, other) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines()
                if ln.startswith("artifact") and "static-minmax" in ln)
    assert " FAIL " in line and "is not the identity" in line and "session.x64quantprecision=0" in line, line
