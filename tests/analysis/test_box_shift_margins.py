"""A box that moved (box-shift: same class, IoU below 0.9) crossed no threshold, so the margin band of a comparison
holds the fp32 margins of its threshold and class flips only, and the terminal says the box shifts have none."""

from __future__ import annotations

import math

from quantbench.analysis.decisions import FixtureComparison, Flip, summarize


def _flip(kind: str, margin: float) -> Flip:
    return Flip(kind=kind, ref_slot=0, slot=0, ref_cls=1, cls=1, ref_score=0.5 + margin, score=0.5, ref_kept=True,
                kept=kind != "threshold", iou=0.5 if kind == "box-shift" else math.nan, margin=margin)


def test_box_shifts_give_no_fp32_margin():
    fc = FixtureComparison(ref_total=3, total=3, flips=[_flip("threshold", 0.01), _flip("box-shift", 0.45),
                                                         _flip("class", -0.02)])
    s = summarize("ref-same", "x86-avx2", "static-minmax", "x86", "static-minmax", [fc], 0.5)
    assert s.by_kind["box-shift"] == 1 and s.flips == 3
    assert s.margins["half_width"] == 0.02   # not the box shift's 0.45
    only_shifts = summarize("ref-same", "x86-avx2", "v", "x86", "v", [FixtureComparison(1, 1, [_flip("box-shift", 0.4)])], 0.5)
    assert not only_shifts.margins.get("band")
