"""equiv's confirm, the choices around a run: which hosts are predicted to share a class (only from a known
fingerprint, only on one architecture, runtime and session), which K fixtures confirm them (those that separated
classes first, then those nearest the threshold, then by id), and that an inherited row never takes a measured
row's run key (when a host is confirmed: tests/hosts/test_confirm_board.py)."""

from __future__ import annotations

import pytest

from quantbench.analysis import confirm as C
from quantbench.errors import ParameterError
from quantbench.hosts.keys import run_key
from quantbench.inputs.assets import demo_model

AVX2 = ["sse4_1", "sse4_2", "osxsave", "avx", "avx2", "fma"]
SESSION = {"intra_op_num_threads": 1, "graph_optimization_level": "all", "providers": ["CPUExecutionProvider"]}


def _x86(flags, **session) -> dict:
    return {"arch": "x86_64", "isa_flags": list(flags), "ort_version": "1.32.0", "session": {**SESSION, **session}}


def test_hosts_with_one_dispatch_signature_join_the_first_named_and_unknown_ones_run_in_full():
    path = str(demo_model("litter-cnn"))
    infos = {"x86": _x86(AVX2), "x86-avx2": _x86(AVX2), "x86-sse4": _x86(AVX2[:2]), "x86-sse4b": _x86(AVX2[:2]),
             "never-seen": None, "other-opt": _x86(AVX2, graph_optimization_level="basic"),
             "pi": {"arch": "aarch64", "isa_flags": ["asimd", "asimddp"], "ort_version": "1.32.0",
                    "session": {**SESSION, "intra_op_num_threads": 4}}}
    got = C.predicted_anchors(list(infos), infos, {"v": path})
    assert got == {"v": {"x86-avx2": "x86", "x86-sse4b": "x86-sse4"}}


def test_the_k_confirming_fixtures_are_the_separating_ones_then_the_nearest_the_threshold():
    ids = ["a", "b", "c", "d", "e"]
    margins = {("v", "a"): 0.5, ("v", "b"): 0.01, ("v", "c"): 0.3, ("v", "d"): 0.02, ("v", "e"): 0.9}
    assert C.confirm_fixtures(2, ids, "v", set(), margins) == ["b", "d"]
    assert C.confirm_fixtures(2, ids, "v", {"e"}, margins) == ["b", "e"]
    assert C.confirm_fixtures(2, ids, "v", {"e", "a", "c"}, margins) == ["a", "c"]
    assert C.confirm_fixtures(2, ids, "v", set(), {}) == ["a", "b"]   # no decisions: by fixture id
    assert C.confirm_fixtures(9, ids, "v", set(), margins) == ids


def test_an_inherited_row_never_takes_the_run_key_a_run_looks_up():
    measured = run_key("v", "f", "fp", "sk")
    rows = C.inherited_rows([{"host": "x86", "variant_id": "v", "variant": "fp32", "fixture_id": "f",
                              "output_name": "o", "dtype": "<f4", "shape": [1], "sha256": "s", "tensor": b"\0" * 4}],
                            "x86-avx2", "fp", "sk", "{}", lambda v, f: run_key(v, f, "fp", "sk"))
    assert rows[0]["run_key"] != measured and rows[0]["inherited"] == "x86" and rows[0]["host"] == "x86-avx2"


@pytest.mark.parametrize("value", [0, -1, "some", 1.5, True])
def test_confirm_takes_a_whole_number_from_1_or_all(value):
    from quantbench.api.confirm import check_confirm

    with pytest.raises(ParameterError) as e:
        check_confirm(value)
    assert e.value.param == "confirm"
    assert check_confirm("all") is None and check_confirm("3") == 3 and check_confirm(2) == 2
