"""The explain commands run a variant under its session requirement (its recipe's session_requirements): remedy
tries every remedy with it (the variant as shipped is the variant under it), localize/noise/latency run it on each
host's session with it added; a host whose own session contradicts it is one line, and a session onnxruntime
cannot make with it is an error naming it, never a run without it."""

from __future__ import annotations

import pytest

from cli_helpers import one_line
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.hosts.registry import parse_hosts
from quantbench.hosts.requirements import REQUIRED, for_hosts
from quantbench.inputs.variantdir import load_variants
from requirement_helpers import X64, bright_images, image_feeds, variants_folder


@pytest.fixture
def required(workdir):
    bright_images(workdir)
    return {v.name: v for v in load_variants(variants_folder(workdir, "required", X64))}


def test_remedy_tries_every_remedy_under_the_requirement(required, workdir):
    from quantbench.explain.remedy import build_remedies

    v = required["static-minmax"]
    rvs = build_remedies(v.path, required["fp32"].path, workdir / "rem", v.recipe,
                         remedies=("baseline", "x64quantprecision", "reduce_range"),
                         feeds=image_feeds(workdir))
    for rv in rvs:
        assert rv.path is not None and X64.items() <= rv.config_entries.items(), rv.remedy
        assert rv.note.endswith("; with the variant's session requirement session.x64quantprecision=1")
    plain = build_remedies(v.path, required["fp32"].path, workdir / "rem2", {}, remedies=("baseline",))
    assert plain[0].config_entries == {}


def test_the_explain_hosts_carry_it_and_a_contradiction_is_one_line(required, workdir, capsys):
    v = required["static-minmax"]
    (h,) = for_hosts(parse_hosts("x86"), v)
    assert h.session["config_entries"] == X64 and h.session[REQUIRED] == X64
    assert for_hosts(parse_hosts("x86"), required["fp32"]) == parse_hosts("x86")   # the fp32 reference: none
    with pytest.raises(UserError, match="host x86\\+session.x64quantprecision=0: variant static-minmax's session "
                                        "requirement session.x64quantprecision=1 cannot be applied: its session sets "
                                        "session.x64quantprecision=0"):
        for_hosts(parse_hosts("x86+session.x64quantprecision=0"), v)
    assert main(["noise", "--variant", str(v.path), "--hosts", "x86", "--session-config",
                 "session.x64quantprecision=0", "--fixtures", "labels.json", "--no-progress"]) == 2
    assert "cannot be applied: its session sets session.x64quantprecision=0" in one_line(capsys.readouterr().err,
                                                                                       "noise")


def test_a_search_from_a_required_variant_runs_under_its_requirement(workdir, capsys):
    """search starts from a variant whose recipe records a session requirement: every host runs the candidates
    with it (as localize and noise do), so a host whose session contradicts it is refused in one line before
    anything runs."""
    from explain_helpers import bright_corpus, saturating_image_model

    model = saturating_image_model(workdir / "m.onnx")
    (workdir / "m.json").write_text('{"decode": {"kind": "classifier-softmax", "logits": "logits"}}')
    labels = bright_corpus(workdir / "corpus", count=4)
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--methods",
                 "minmax", "--allow-short", "--require-session", "session.x64quantprecision=1", "--no-progress"]) == 0
    capsys.readouterr()
    before = sorted(p.relative_to(workdir).as_posix() for p in (workdir / "results").rglob("*"))
    assert main(["search", "--variant", "static-minmax", "--hosts", "x86", "--session-config",
                 "session.x64quantprecision=0", "--space", "global", "--no-progress"]) == 2
    assert ("--session-config: the search's answer carries only the session entries its variant records"
            in one_line(capsys.readouterr().err, "search"))   # refused before the requirement is even applied
    assert sorted(p.relative_to(workdir).as_posix() for p in (workdir / "results").rglob("*")) == before


def test_a_search_from_a_required_variant_keeps_its_requirement(workdir, capsys):
    """The base's session requirement is part of what it is: the variant as calibrated meeting the budget is the
    base itself (nothing written, its requirement shown), and a variant the search writes from it requires the
    same entries (the shared-weight model: onnxruntime cannot make its int8 session under x64quantprecision on
    AVX2 and up, so another recipe is written)."""
    import json

    from explain_helpers import bright_corpus
    from quantbench.hosts.masked import here_features
    from requirement_helpers import saturating_image_model

    folder = workdir / "results" / "variants"
    for model, shared in (("m", False), ("tied", True)):
        saturating_image_model(workdir / f"{model}.onnx", shared=shared)
        (workdir / f"{model}.json").write_text('{"decode": {"kind": "classifier-softmax", "logits": "logits"}}')
    labels = bright_corpus(workdir / "corpus", count=4)
    calib = ["--labels", str(labels), "--per-cell", "2", "--methods", "minmax", "--allow-short", "--require-session",
             "session.x64quantprecision=1", "--no-progress"]
    assert main(["calibrate", "--model", str(workdir / "m.onnx"), *calib]) == 0
    before = sorted(p.name for p in (folder / "m").iterdir())
    capsys.readouterr()
    assert main(["search", "--variant", "static-minmax", "--hosts", "x86", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "the variant as calibrated meets the budget: nothing new written" in out
    assert "session requirements: session.x64quantprecision=1" in out
    assert sorted(p.name for p in (folder / "m").iterdir()) == before
    if "avx2" not in here_features():
        return   # onnxruntime makes the tied model's session here: its base passes as it is
    assert main(["calibrate", "--model", str(workdir / "tied.onnx"), *calib]) == 0
    assert main(["search", "--variant", "static-minmax", "--hosts", "x86", "--no-progress"]) == 0
    out = capsys.readouterr().out
    name = out.split("chosen: ", 1)[1].split()[0]
    recipe = json.loads((folder / "tied" / f"{name}.recipe.json").read_text())
    assert recipe["search"]["base_variant"] == "static-minmax" and recipe["session_requirements"] == X64, out
