"""The accuracy reason for a decode plug-in: the 'box_frame' hint only when its decisions have boxes."""

import numpy as np

from quantbench.analysis.accuracy import accuracy_table
from quantbench.analysis.decode import Decoded
from report_helpers import _truth, hand_result


def _plugin_result(with_boxes: bool):
    result = hand_result()
    for v in result.variants:
        v["decode"] = {"kind": "my_decoder.py:decode", "threshold": 0.5, "classes": ["cat"], "outputs": {}}
    box = np.array([[0.0, 0.0, 1.0, 1.0]]) if with_boxes else None
    d = Decoded(slot=np.zeros(1, np.int64), cls=np.zeros(1, np.int64), score=np.array([0.9]),
                kept=np.ones(1, bool), margin=np.array([0.4]), box=box)
    result.decoded = {(h, v["variant_id"], f): d for h in result.hosts for v in result.variants
                      for f in result.settings["fixtures"][v["variant_id"]]}
    fids = sorted({f for fx in result.settings["fixtures"].values() for f in fx})
    truth = _truth({f: [{"image_id": 1, "category_id": 7, "bbox": [0, 0, 5, 5]}] for f in fids},
                   categories={7: "cat"})
    return result, truth


def test_plugin_without_boxes_is_not_told_to_say_its_boxes_frame():
    result, truth = _plugin_result(with_boxes=False)
    why = accuracy_table(result, {}, truth)["m"]["plan"]
    assert isinstance(why, str)
    assert "box_frame" not in why and "boxes' frame" not in why
    assert "no boxes" in why


def test_plugin_with_boxes_is_told_to_say_its_boxes_frame():
    result, truth = _plugin_result(with_boxes=True)
    why = accuracy_table(result, {}, truth)["m"]["plan"]
    assert isinstance(why, str) and "box_frame" in why
