"""The calibration methods table (quantbench.quantize.methods): each method maps to onnxruntime's enum and
back, calibrate's --methods choices and the pipeline's parameter check come from it."""

from __future__ import annotations

import pytest
from onnxruntime.quantization.calibrate import CalibrationMethod

from quantbench.cli import build_parser
from quantbench.cli.config import option_actions
from quantbench.errors import ParameterError
from quantbench.quantize import methods as M, ort_api
from quantbench.quantize.pipeline import CalibrateOptions, _check


@pytest.mark.parametrize("name", list(M.METHODS))
def test_every_method_is_an_onnxruntime_calibration_method(name):
    member = ort_api.calibration_method(name)
    assert isinstance(member, CalibrationMethod)
    assert ort_api.method_name(ort_api.tensors_data(name, {})) == name
    assert all(isinstance(option, str) for option, _ in M.METHODS[name].options)


def test_the_options_each_method_takes():
    assert [m for m in M.METHODS if M.takes(m, "percentile")] == ["percentile"]
    assert [m for m in M.METHODS if M.takes(m, "entropy_bins")] == ["entropy"]
    assert not M.takes(M.DYNAMIC, "percentile") and M.wanted(["minmax", "entropy"], "entropy_bins")


def test_calibrate_offers_the_table():
    actions = option_actions(build_parser(config=False, commands=["calibrate"])._qb_leaves["calibrate"])
    assert actions["methods"].default == ",".join(M.DEFAULT_METHODS) == "dynamic,minmax,percentile"
    assert set(M.DEFAULT_METHODS) < set(M.VARIANT_METHODS) == {"dynamic", "minmax", "percentile", "entropy"}
    assert "entropy" in actions["methods"].help    # still a choice, named in the help
    assert actions["percentile"].default == dict(M.METHODS["percentile"].options)["percentile"]


def test_an_unknown_method_lists_the_table():
    with pytest.raises(ParameterError, match=r"unknown \['kmeans'\]; choose from dynamic, minmax, percentile, entropy"):
        _check(CalibrateOptions(methods=["minmax", "kmeans"]))
