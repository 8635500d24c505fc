"""The equivalence analysis' request (analysis.equiv.AnalysisRequest, Selection): a bad value fails when the request
is made, as one ParameterError naming the parameter and what to do, before any table is read."""

import pytest

from quantbench.analysis.equiv import AnalysisRequest, Selection, VariantRef
from quantbench.errors import ParameterError

FP32 = VariantRef(name="fp32", variant_id="a" * 64, model="m", sidecar=None)
INT8 = VariantRef(name="dynamic", variant_id="b" * 64, model="m", sidecar=None)


def _selection(**changes) -> Selection:
    given = {"hosts": ["pi", "x86", "pi"], "variants": [FP32, INT8],
             "fixtures_for": {FP32.variant_id: ["f1"], INT8.variant_id: ["f1"]}, **changes}
    return Selection(**given)


def test_a_request_keeps_the_hosts_once_and_defaults_the_reference_to_the_first():
    request = AnalysisRequest(_selection(), budget="2")
    assert request.selection.hosts == ("pi", "x86")
    assert request.reference == "pi"
    assert request.budget == 2   # a count given as text is the count
    assert AnalysisRequest(_selection(), budget="1%").budget == "1%"


@pytest.mark.parametrize("changes, param, words", [
    ({"hosts": []}, "hosts", "name at least one"),
    ({"hosts": "pi,x86"}, "hosts", "list of strings"),
    ({"variants": []}, "variants", "at least one variant"),
    ({"variants": [FP32, "dynamic"]}, "variants", "VariantRef"),
    ({"fixtures_for": {FP32.variant_id: ["f1"]}}, "fixtures_for", "no fixtures for variant dynamic"),
    ({"prefer": [("fp", "sk")]}, "prefer", "dict keyed by host"),
])
def test_a_bad_selection_names_its_parameter(changes, param, words):
    with pytest.raises(ParameterError) as caught:
        _selection(**changes)
    assert caught.value.param == param and words in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("changes, param, words", [
    ({"selection": {"hosts": ["pi"]}}, "selection", "give a Selection"),
    ({"reference": "arm"}, "reference", "not one of the hosts pi,x86"),
    ({"atol": float("nan")}, "atol", "finite number"),
    ({"rtol": -1.0}, "rtol", "at least 0"),
    ({"budget": "lots"}, "budget", "number of flips"),
    ({"decode_kind": 3}, "decode_kind", "decode kind's name"),
])
def test_a_bad_request_names_its_parameter(changes, param, words):
    given = {"selection": _selection(), **changes}
    with pytest.raises(ParameterError) as caught:
        AnalysisRequest(**given)
    assert caught.value.param == param and words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_request_is_frozen():
    request = AnalysisRequest(_selection())
    with pytest.raises(AttributeError):
        request.reference = "x86"
