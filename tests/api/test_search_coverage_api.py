"""Where a search's answer holds, said wherever the answer goes (summary, result, recipe, report): the fixtures and
hosts it was measured on, and the known hosts it was not checked on, another name of a host it ran not among them."""

from __future__ import annotations

import json

from model_helpers import transformer_like_classifier
from quantbench.cli import main
from search_helpers import calibrate_small, result_of


def test_the_recipe_and_report_say_where_the_answer_holds_and_which_hosts_it_was_not_checked_on(workdir, capsys):
    calibrate_small(workdir, transformer_like_classifier)
    capsys.readouterr()
    assert main(["search", "--variant", "static-minmax", "--hosts", "x86", "--limit", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    result = result_of(out)
    held = result["holds_on"]
    assert held["fixtures"] == 2 and held["limit"] == 2 and held["hosts"] == ["x86"]
    assert {"pi", "x86-avx512", "x86-avx2"} <= set(held["unchecked_hosts"])
    assert "local" not in held["unchecked_hosts"]   # `local` is x86 under another name: the host the search ran
    recipe = json.loads((workdir / f"results/variants/m/{result['variant_name']}.recipe.json").read_text())
    assert recipe["search"]["holds_on"] == held
    report = (workdir / "results/report.md").read_text()
    assert "holds on: 2 fixtures (a limit of the eval split) on x86; not checked on: docker-arm64, " in report
    assert "confirm with a fresh equiv over the whole split on every host it ships to" in out
