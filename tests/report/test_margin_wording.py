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


def test_a_threshold_maps_margin_line_says_what_it_measures():
    """threshold-map serves regions: a region appearing or vanishing is decided by its peak pixel's probability,
    a region changing shape (box-shift) by no score at all (was: "every flip against fp32 had an fp32 score in
    [5.96e-08, 1]", the box-shifts' peaks of 1 included, which says nothing)."""
    from quantbench.analysis.decode import IOU_SHIFT

    result, compared = _result("threshold-map", 0.5)
    compared[0]["by_kind"] = {"threshold": 2, "box-shift": 3}
    line = " ".join(_summary_concealed_and_margins(result, compared))
    assert ("every region that appeared or vanished against fp32 had an fp32 peak probability (its highest pixel) "
            "in [0.3, 0.6] (within 0.2 of the threshold)") in line, line
    assert (f"3 region flip(s) against fp32 changed a region's shape (IoU below {IOU_SHIFT:g} with its fp32 region), not "
            "whether it is there: no probability measures those") in line, line


def test_a_threshold_maps_band_holds_only_the_regions_that_appeared_or_vanished():
    """decisions.summarize takes the band from the flip kinds the decoder's margins measure (threshold-map: only
    threshold flips; a box-shift's margin is its region's peak, far from the threshold)."""
    import numpy as np

    from quantbench.analysis import decisions as D
    from quantbench.analysis.decode import kind_of

    shift = D.Flip(kind="box-shift", ref_slot=0, slot=0, ref_cls=0, cls=0, ref_score=1.0, score=1.0, ref_kept=True,
                   kept=True, iou=0.3, margin=0.5)
    gone = D.Flip(kind="threshold", ref_slot=1, slot=-1, ref_cls=0, cls=-1, ref_score=0.55, score=np.nan,
                  ref_kept=True, kept=False, iou=np.nan, margin=0.05)
    fc = D.FixtureComparison(ref_total=2, total=1, flips=[shift, gone])
    s = D.summarize("own-fp32", "x86", "dynamic", "x86", "fp32", [fc], 0.5,
                    margin_kinds=kind_of("threshold-map").margin_flips)
    assert s.flips == 2 and s.margins["band"] == [0.5, 0.55] and s.margins["flips"] == 1


def test_box_shifts_are_said_to_have_no_fp32_margin():
    result, compared = _result("yolo", 0.25)
    compared[0]["by_kind"] = {"threshold": 1, "class": 0, "box-shift": 3}
    line = " ".join(_summary_concealed_and_margins(result, compared))
    assert "3 flip(s) against fp32 are box shifts" in line and "no fp32 margin is given for them" in line
