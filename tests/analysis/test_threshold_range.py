"""A decision threshold outside [0, 1] where the decoder's scores are probabilities keeps (or drops)
everything: refused, naming the valid range, from --threshold and from a sidecar alike."""

import os

import pytest

from quantbench.analysis.decode import spec_from_sidecar
from quantbench.cli import main
from quantbench.errors import ParameterError, UserError


@pytest.mark.parametrize("value", ["-1", "1.5"])
def test_threshold_flag_outside_probabilities_refused(workdir, capsys, value):
    assert main(["equiv", "--hosts", "x86", "--decode", "classifier-softmax", "--threshold", value,
                 "--no-progress", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"quantbench equiv: error: --threshold {float(value)}: must be in [0, 1] "
                          "(classifier-softmax scores are probabilities; "), err
    assert err.count("\n") == 1 and os.listdir(workdir) == []


@pytest.mark.parametrize("kind", ["detr-sigmoid", "classifier-softmax", "threshold-map", "yolo"])
def test_sidecar_threshold_outside_probabilities_refused(kind):
    with pytest.raises(UserError, match=rf"^m.json: decode 'threshold' -0.5: must be in \[0, 1\] \({kind} scores"):
        spec_from_sidecar({"decode": {"kind": kind, "threshold": -0.5}}, source="m.json")
    with pytest.raises(ParameterError, match=r"^threshold=2.0: must be in \[0, 1\]"):
        spec_from_sidecar({"decode": {"kind": kind}}, threshold=2.0, source="m.json")
    for ok in (0.0, 1.0, 0.3):
        assert spec_from_sidecar({"decode": {"kind": kind}}, threshold=ok, source="m.json").threshold == ok
