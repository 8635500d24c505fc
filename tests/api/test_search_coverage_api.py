"""Where a search's answer holds, said wherever the answer goes (summary, result, recipe, report): the fixtures and
hosts it was measured on, and the known hosts it was not checked on, another name of a host it ran not among them."""

from __future__ import annotations

import json

from model_helpers import transformer_like_classifier
from quantbench.api.search import unchecked_hosts
from quantbench.cli import main
from quantbench.hosts.registry import known_hosts, resolve_hosts
from search_helpers import calibrate_small, result_of
from setup_required import need_tier

# The transformer-like classifier's answer (16-bit activations on fc1) holds on AVX2 kernels, which the masked tier
# shows on any CPU with AVX2+FMA; on an AVX-512 VNNI CPU's own kernels no candidate with int8 left meets the budget.
HOST = "x86-avx2"


def test_the_recipe_and_report_say_where_the_answer_holds_and_which_hosts_it_was_not_checked_on(workdir, capsys):
    need_tier(HOST)
    calibrate_small(workdir, transformer_like_classifier)
    capsys.readouterr()
    assert main(["search", "--variant", "static-minmax", "--hosts", HOST, "--limit", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    result = result_of(out)
    held = result["holds_on"]
    assert held["fixtures"] == 2 and held["limit"] == 2 and held["hosts"] == [HOST]
    assert {"pi", "x86-avx512", "x86", "local"} <= set(held["unchecked_hosts"]) and HOST not in held["unchecked_hosts"]
    recipe = json.loads((workdir / f"results/variants/m/{result['variant_name']}.recipe.json").read_text())
    assert recipe["search"]["holds_on"] == held
    report = (workdir / "results/report.md").read_text()
    assert f"holds on: 2 fixtures (a limit of the eval split) on {HOST}; not checked on: docker-arm64, " in report
    assert "confirm with a fresh equiv over the whole split on every host it ships to" in out


def test_another_name_of_a_host_the_search_ran_is_not_left_unchecked():
    known = known_hosts()
    for ran, alias in (("x86", "local"), ("local", "x86")):
        left = unchecked_hosts(known, resolve_hosts([ran]))
        assert alias not in left and ran not in left and {"pi", "x86-avx2"} <= set(left)   # the same kind and session
    assert "local" in unchecked_hosts(known, resolve_hosts(["x86-avx2"]))
