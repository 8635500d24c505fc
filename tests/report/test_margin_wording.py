"""The summary's margin line words a flip's margin as its decoder defines it: a plug-in's margin is its own
(score minus threshold by default), a recogniser's the smallest per-step gap, never a classifier's top-1/top-2 gap."""

from __future__ import annotations

from types import SimpleNamespace

from quantbench.report.termsummary import _summary_concealed_and_margins


def _result(kind: str, threshold=None):
    base = threshold or 0.0
    margins = {"band": [base - 0.2, base + 0.1], "half_width": 0.2, "threshold": threshold, "flips": 2}
    comp = {"comparison": "own-fp32", "variant_id": "v1", "variant": "dynamic", "host": "x86", "concealed": False,
            "margins": margins}
    result = SimpleNamespace(comparisons=[comp], variants=[{"variant_id": "v1", "model": "m", "variant": "dynamic",
                                                            "decode": {"kind": kind, "threshold": threshold}}])
    return result, [comp]


def test_a_plugins_margin_is_not_called_a_probability_gap():
    line = " ".join(_summary_concealed_and_margins(*_result("dec.py:decode")))
    assert "top-1/top-2" not in line and "probability" not in line
    assert "within 0.2 of its decision boundary (fp32 margin as the plug-in returns it)" in line


def test_a_classifier_without_threshold_keeps_its_top1_top2_wording():
    line = " ".join(_summary_concealed_and_margins(*_result("classifier-softmax")))
    assert "fp32 top-1 minus top-2 probability" in line


def test_a_recognisers_margin_is_the_smallest_per_step_gap():
    line = " ".join(_summary_concealed_and_margins(*_result("ctc")))
    assert "smallest per-step top-1 minus top-2 probability" in line


def test_with_a_threshold_the_band_of_scores_is_given():
    line = " ".join(_summary_concealed_and_margins(*_result("dec.py:decode", 0.5)))
    assert "fp32 score in [0.3, 0.6]" in line and "within 0.2 of the threshold" in line
