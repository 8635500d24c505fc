"""Verdict lines a person can act on: each opens with SHIP, SHIP WITH CARE or DO NOT SHIP against the budget,
then the numbers (flips vs fp32 per host, whether the hosts serve identical decisions, the classes)."""

from quantbench.report import verdict
from quantbench.analysis.gates import DO_NOT_SHIP, NO_VERDICT, SHIP, SHIP_WITH_CARE, ship_verdict
from report_helpers import _cls, hand_result


def test_a_failed_gate_never_reads_as_ships():
    # the old line: "**dynamic** ships on x86, pi: one class; 3 decision flips ...; gate decision (budget 0): FAIL"
    lines = verdict.verdict_lines(hand_result())
    dyn = lines[1]
    assert dyn.startswith("- **DO NOT SHIP** dynamic: ")
    assert "ships on" not in dyn
    assert "3 decision flips vs fp32 (fp32 on x86) on x86, pi, 2 of 10 images disagree (budget 0)" in dyn
    assert "the hosts serve identical decisions" in dyn and "one class of bytes" in dyn
    assert "gate decision (budget 0): FAIL (decision: 3 of 4 comparisons over 0 flips)" in dyn


def test_fp32_with_identical_decisions_ships_and_names_its_classes():
    r = hand_result()
    r.variants[0]["classes"] = [_cls("A", ["x86"], "d0"), _cls("B", ["pi"], "d9")]
    fp32 = verdict.verdict_lines(r)[0]
    assert fp32.startswith("- **SHIP** fp32: ")
    assert "0 decision flips vs fp32 (fp32 on x86) on pi, 10 images compared" in fp32
    assert "the hosts serve identical decisions" in fp32
    assert "2 classes of bytes (A: x86 | B: pi)" in fp32 and "gate decision (budget 0): pass" in fp32


def test_flips_within_the_budget_ship_with_care():
    r = hand_result()
    r.settings["budget"] = 5
    for c in r.comparisons:
        c["decision_passed"] = c["flips"] <= 5
    dyn = verdict.verdict_lines(r)[1]
    assert dyn.startswith("- **SHIP WITH CARE** dynamic: ")
    assert "(budget 5)" in dyn and "gate decision (budget 5): pass" in dyn


def test_hosts_that_serve_different_decisions_ship_with_care():
    r = hand_result()
    r.settings["budget"] = 5
    for c in r.comparisons:
        if c["variant"] == "dynamic" and c["comparison"] == "ref-same":
            c["flips"], c["images_disagree"] = 2, 1
        c["decision_passed"] = c["flips"] <= 5
    dyn = verdict.verdict_lines(r)[1]
    assert dyn.startswith("- **SHIP WITH CARE** dynamic: ")
    assert "the hosts serve different decisions: pi vs x86 2 flips on 1 image" in dyn


def test_the_rule():
    assert ship_verdict(gates_passed=False, flips=[0], hosts_differ=False, classes=1, compared=True) == DO_NOT_SHIP
    assert ship_verdict(gates_passed=True, flips=[0, 0], hosts_differ=False, classes=2, compared=True) == SHIP
    assert ship_verdict(gates_passed=True, flips=[0, 1], hosts_differ=False, classes=1, compared=True) == SHIP_WITH_CARE
    assert ship_verdict(gates_passed=True, flips=[0], hosts_differ=True, classes=1, compared=True) == SHIP_WITH_CARE
    # decode none: the tensor gate only; bytes that differ between hosts are a reason for care
    assert ship_verdict(gates_passed=True, flips=[], hosts_differ=None, classes=1, compared=False) == SHIP
    assert ship_verdict(gates_passed=True, flips=[], hosts_differ=None, classes=2, compared=False) == SHIP_WITH_CARE
    # decode none and no gate (no tolerance the user set): no verdict, whatever the bytes
    assert ship_verdict(gates_passed=True, flips=[], hosts_differ=None, classes=1, compared=False,
                        gated=False) == NO_VERDICT
    assert ship_verdict(gates_passed=False, flips=[0], hosts_differ=False, classes=1, compared=True,
                        gated=False) == DO_NOT_SHIP   # a decoder's gate is always checked
