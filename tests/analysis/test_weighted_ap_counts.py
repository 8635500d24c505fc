"""weighted_ap counts images: its weights are whole numbers of draws (a bootstrap resample's), anything else is
refused by name rather than scored."""

import numpy as np
import pytest

from quantbench.analysis import metrics
from quantbench.errors import ParameterError

GT = {1: np.array([[0, 0, 40, 20, 1]], float), 2: np.array([[0, 0, 40, 20, 1]], float)}
DETS = {1: np.array([[0, 0, 40, 20, 0.9, 1]]), 2: np.array([[10, 0, 50, 20, 0.8, 1]])}


def test_whole_counts_are_scored():
    ap50, ap = metrics.weighted_ap(metrics.coco_matches(DETS, GT), np.array([[1, 1], [2, 0], [0, 0]], float))
    assert ap50[:2].tolist() == [1.0, 1.0] and np.isnan(ap50[2]) and np.isnan(ap[2])


@pytest.mark.parametrize("weights", [[[0.5, 1.0]], [[-1.0, 1.0]], [[np.nan, 1.0]], [1.0, 1.0]])
def test_weights_that_are_not_counts_are_refused(weights):
    with pytest.raises(ParameterError, match="^weights: must be a"):
        metrics.weighted_ap(metrics.coco_matches(DETS, GT), np.array(weights, float))
