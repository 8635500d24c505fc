"""threshold-map (a DBNet-style text detector's probability map) is scored: its connected regions above the
threshold, boxed and mapped back to the image, are matched against the labelled boxes by IoU (COCO AP, whatever
the labels' category: a map has one class), as a detector's boxes are."""

import numpy as np

from quantbench.analysis.accuracy import accuracy_table
from quantbench.analysis.decode import decode, spec_from_sidecar
from quantbench.analysis.equiv import _slim
from report_helpers import _truth, hand_result

H, W = 50, 100          # the model input (and map) of _truth's default preprocessing; images are 100 x 200


def _map(regions) -> np.ndarray:
    """A [1, 1, H, W] probability map: 0.9 inside each (x1, y1, x2, y2) region of the map, 0.05 elsewhere."""
    m = np.full((1, 1, H, W), 0.05, np.float32)
    for x1, y1, x2, y2 in regions:
        m[..., y1:y2, x1:x2] = 0.9
    return m


def _scored(maps: dict, labelled: dict):
    spec = spec_from_sidecar({"decode": {"kind": "threshold-map", "threshold": 0.3}})
    result = hand_result()
    for v in result.variants:
        v["decode"] = {"kind": "threshold-map", "threshold": 0.3, "classes": [], "outputs": {"map": "map"}}
    fids = sorted({f for fx in result.settings["fixtures"].values() for f in fx})
    result.decoded = {(h, v["variant_id"], f): _slim(decode(spec, {"map": maps[v["variant"]][i % 2]}))
                      for h in result.hosts for v in result.variants for i, f in enumerate(fids)}
    truth = _truth({f: labelled[i % 2] for i, f in enumerate(fids)}, categories={3: "text"})
    return accuracy_table(result, {}, truth)["m"]


# two words per image: map regions (in map pixels) and their labelled boxes (image pixels, twice the map's)
REGIONS = [[(5, 5, 30, 15), (40, 30, 90, 45)], [(10, 20, 60, 35)]]
LABELS = [[{"image_id": 1, "category_id": 3, "bbox": [2 * x1, 2 * y1, 2 * (x2 - x1), 2 * (y2 - y1)]}
           for x1, y1, x2, y2 in r] for r in REGIONS]


def test_map_regions_that_cover_the_labelled_boxes_score_ap_one_and_missed_ones_less():
    good = [_map(r) for r in REGIONS]
    missed = [_map(REGIONS[0][:1]), _map([])]            # one word of three found
    got = _scored({"fp32": good, "dynamic": missed, "static-entropy": good}, LABELS)
    plan = got["plan"]
    assert not isinstance(plan, str), plan
    scores = got["scores"]
    assert scores[("fp32", "x86")]["metric"] == "AP" and scores[("fp32", "x86")]["value"] == 1.0
    assert 0 < scores[("dynamic", "x86")]["value"] < 0.5


def test_a_map_model_without_labelled_boxes_says_so():
    got = _scored({"fp32": [_map(r) for r in REGIONS], "dynamic": [_map([])] * 2,
                   "static-entropy": [_map([])] * 2}, [[], []])
    assert isinstance(got["plan"], str) and "no ground-truth boxes" in got["plan"]
