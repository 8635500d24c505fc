"""Pairs of global choices (explain/search/pairs.py): when no single global choice meets the budget, an op type
left out of QDQ combined with a numeric choice is tried, measured and ranked as the others, named for both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from explain_helpers import near_tie_image_model
from quantbench.cli import main
from search_helpers import calibrate_small, copy_run, result_of
from setup_required import need_tier


@pytest.fixture(scope="module")
def near_tie(tmp_path_factory):
    """A calibrate run (minmax and percentile) of the near-tie classifier with a Softmax: every int8 form of its
    one MatMul ties the two top classes, so no global choice, single or paired, meets a budget of 0 flips on any
    CPU."""
    return calibrate_small(tmp_path_factory.mktemp("near_tie_pairs"), lambda path: near_tie_image_model(
        path, softmax=True), "minmax,percentile")


@pytest.fixture
def tie_dir(near_tie, workdir):
    return copy_run(near_tie, workdir)


def test_pairs_of_an_op_type_in_float_and_a_numeric_choice_are_tried_when_no_single_choice_passes(tie_dir, capsys):
    rc = main(["search", "--variant", "static-minmax", "--hosts", "x86", "--space", "global", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 1, captured.out
    result = result_of(captured.out)
    singles = [r for r in result["tried"] if "+" not in r["choice"]]
    pairs = [r for r in result["tried"] if "+" in r["choice"]]
    assert singles and not any(r["passes"] for r in singles)
    by_name = {r["choice"]: r["recipe"] for r in singles}
    base = by_name["base"]
    ops = {n for n, r in by_name.items() if r["exclude_op_types"] != base["exclude_op_types"]}
    assert ops and pairs, [r["choice"] for r in result["tried"]]
    for r in pairs:
        op, numeric = r["choice"].split("+")
        assert op in ops and numeric in by_name and numeric not in ops
        assert r["recipe"]["exclude_op_types"] == by_name[op]["exclude_op_types"]
        changed = {k: v for k, v in by_name[numeric].items() if k not in ("name",) and v != base[k]}
        assert changed and all(r["recipe"][k] == v for k, v in changed.items()), (r["choice"], changed)
        assert r["stage"] in ("screen", "confirm") and not r["passes"] and r["exclude"] == []
    assert {"reduce_range", "percentile", "symmetric_activations", "x64quantprecision"} <= {
        r["choice"].split("+")[1] for r in pairs if r["choice"].startswith("float_softmax+")}
    ids = [r["variant_id"] for r in result["tried"]]
    for i, r in enumerate(result["tried"]):   # a pair building a model already measured is not measured again
        assert "+" not in r["choice"] or r["variant_id"] not in ids[:i], r["choice"]
    assert "search: pairs of global choices (op types left in float with a numeric choice): " in captured.err
    report = (tie_dir / "results/report.md").read_text()
    assert pairs[0]["choice"] in report


def test_no_pair_is_tried_when_a_single_global_choice_passes(run_dir, capsys):
    """The saturating classifier on x86-avx2: the variant as calibrated flips and x64quantprecision meets the
    budget, so the global phase ends on the single choices, nothing paired."""
    need_tier("x86-avx2")
    rc = main(["search", "--variant", "static-minmax", "--hosts", "x86-avx2", "--space", "global", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.out
    result = result_of(captured.out)
    assert result["chosen"]["choice"] == "x64quantprecision"
    assert not [r["choice"] for r in result["tried"] if "+" in r["choice"]]
    assert "search: pairs of global choices" not in captured.err


def test_a_pair_is_the_op_choice_with_the_numeric_choices_changes():
    from quantbench.explain.search.pairs import kinds, pair
    from quantbench.explain.search.space import Choice

    base = Choice("base", "minmax", "r.json", "u8", "s8", True, False)
    soft = Choice("float_softmax", "minmax", "r.json", "u8", "s8", True, False, exclude_op_types=("Softmax",))
    rr = Choice("reduce_range", "minmax", "r.json", "u8", "s8", True, True)
    x64 = Choice("x64quantprecision", "minmax", "r.json", "u8", "s8", True, False, (("k", "1"),))
    assert kinds([base, soft, rr, x64], base) == ([soft], [rr, x64])
    both = pair(soft, x64, base)
    assert both.name == "float_softmax+x64quantprecision" and both.exclude_op_types == ("Softmax",)
    assert both.session == (("k", "1"),) and not both.reduce_range
    assert json.dumps(both.describe())


@pytest.mark.slow
def test_on_the_demo_detector_pairs_are_tried_exactly_when_no_single_global_choice_passes(workdir):
    """The demo detector (Softmax, LayerNormalization, Gelu and MatMuls of two activations in its attention blocks)
    on this CPU, 4 fixtures,
    a budget of 0 flips: pairs of an op type left in float and a numeric choice are tried when, and only when, no
    single global choice meets it (which of the two holds depends on this CPU's int8 kernels)."""
    def qb(*args):
        return subprocess.run([sys.executable, "-m", "quantbench", *args], cwd=workdir, capture_output=True,
                              text=True)

    assert qb("calibrate", "--model", "litter-detr-tiny", "--methods", "minmax", "--no-progress").returncode == 0
    found = qb("search", "--variant", "static-minmax", "--hosts", "x86", "--limit", "4", "--space", "global",
               "--max-evaluations", "60", "--json", "--no-progress")
    outcome = json.loads(found.stdout)
    result = json.loads(Path(outcome["result_file"]).read_text())
    singles = [r for r in result["tried"] if "+" not in r["choice"]]
    pairs = [r["choice"] for r in result["tried"] if "+" in r["choice"]]
    ops = {r["choice"] for r in singles if r["recipe"]["exclude_op_types"] != singles[0]["recipe"]["exclude_op_types"]
           or r["recipe"]["float_nodes"]}   # an op type, or a group of nodes (attention's MatMuls), left in float
    assert {"float_softmax", "float_layernormalization", "float_activation_matmuls"} <= ops, ops
    if any(r["passes"] for r in singles):
        assert pairs == [], pairs
    else:
        assert pairs and all(p.split("+")[0] in ops and p.split("+")[1] not in ops for p in pairs), pairs
        assert "search: pairs of global choices (op types left in float with a numeric choice): " in found.stderr
