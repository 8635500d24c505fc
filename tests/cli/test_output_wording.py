"""Words in the output that said something untrue.

Was: a sidecar without a 'shape' for a dynamic input was told 'or pass --sidecar FILE' though it was the
--sidecar; the equiv header said 'decode x.py:decode, top-1' for a plug-in (whose decisions are its own);
flips and the gallery named a plug-in's class indices with the sidecar's class names; the hosts table cut
CPU names mid-word (60 characters) and 'separated by cpu (...)' showed two different CPUs as the same
shortened text; the README said verify 're-runs a sample of fixtures', which it does only with --host.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quantbench.report import equivsection, termsummary
from quantbench.analysis.decode import DecodeSpec
from quantbench.errors import UserError
from quantbench.inputs.preprocess import input_spec
from report_helpers import hand_result

HASWELL = "GenuineIntel family 6 model 60 (Intel Core Processor (Haswell, no TSX, IBRS))"
SKYLAKE = "GenuineIntel family 6 model 85 (Intel Xeon Processor (Skylake, IBRS))"


def test_a_sidecar_without_a_shape_is_told_to_add_one_not_to_pass_a_sidecar():
    with pytest.raises(UserError) as given:
        input_spec({"input": {"scale": 1 / 255}}, [1, 3, None, None], "x", source="side.json")
    assert "pass sidecar" not in str(given.value) and "add one" in str(given.value)
    with pytest.raises(UserError) as none:
        input_spec(None, [1, 3, None, None], "x", source="m.onnx")
    # no sidecar at all: the hint is right (the library names the parameter; the CLI shows it as --sidecar)
    assert "or pass sidecar FILE" in str(none.value)


def _plugin_result():
    result = hand_result()
    for v in result.variants:
        v["decode"] = {"kind": "ctc_decode.py:decode", "threshold": None, "classes": ["a", "b"], "outputs": {}}
    return result


def test_equiv_header_names_a_plugin_as_one_without_top1():
    head = termsummary.equiv_summary_text(_plugin_result()).splitlines()[0]
    assert "decode plug-in ctc_decode.py:decode" in head and "top-1" not in head


def test_a_plugins_class_indices_are_not_named_with_the_sidecars_classes():
    plugin = DecodeSpec(kind="ctc_decode.py:decode", outputs={}, classes=["cat", "dog"])
    assert (plugin.class_name(1), plugin.class_name(-1)) == ("1", "")
    assert DecodeSpec(kind="classifier-softmax", outputs={}, classes=["cat", "dog"]).class_name(1) == "dog"


def test_hosts_table_keeps_the_whole_cpu_name():
    result = hand_result()
    result.hosts["x86"]["cpu"] = HASWELL
    assert any(HASWELL in ln for ln in equivsection.hosts_lines(result))


def test_hosts_table_says_how_each_cpu_was_shown():
    result = hand_result()
    result.hosts["x86"]["cpu_mechanism"] = "native-masked"
    rows = equivsection.hosts_lines(result)
    cells = {ln.split("|")[1].strip(): ln.split("|")[3].strip() for ln in rows if ln.startswith("| ")}
    assert cells["host"] == "runs as" and cells["x86"] == "native-masked"
    assert cells["pi"] == "-"  # a summary from before fingerprints said


def test_separating_cpu_values_read_differently():
    result = hand_result()
    for v in result.variants:
        v["classes"] = [{"label": "A", "hosts": ["x86"], "digest": "d"}, {"label": "B", "hosts": ["pi"], "digest": "e"}]
        v["separating_features"] = ["cpu"]
        v["feature_values"] = {"x86": {"cpu": HASWELL}, "pi": {"cpu": SKYLAKE}}
    line = next(ln for ln in termsummary.equiv_summary_text(result).splitlines() if "cpu (" in ln)
    sep = line.split("cpu (", 1)[1]
    a, b = sep.rsplit(")", 1)[0].split(" / ")
    assert a != b and "Haswell" in a and "Skylake" in b


def test_short_values_are_cut_at_a_word():
    assert termsummary._short("Intel Core Processor (Haswell)", 24) == "Intel Core Processor..."


def test_readme_says_verify_reruns_only_with_host():
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "verify re-runs a sample of fixtures" not in text
    assert "`verify --host H` also re-runs a sample of fixtures" in text
