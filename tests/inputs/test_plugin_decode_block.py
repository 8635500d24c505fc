"""A decode plug-in named on the command line picks up the decode block written for it, however the path to its
file is spelled (dec.py, ./dec.py, its absolute path): its own keys (box_frame, thresholds) reach it."""

from __future__ import annotations

from quantbench.analysis.decode import spec_from_sidecar
from quantbench.inputs.plugins import allow, same_ref
from quantbench.inputs.sidecarfile import with_decode

PLUGIN = "def decode(outputs, spec):\n    return {'cls': [], 'score': [], 'kept': []}\n"


def test_the_block_written_for_a_plugin_reaches_it_however_its_path_is_spelled(workdir):
    (workdir / "dec.py").write_text(PLUGIN)
    side = {"decode": {"kind": "./dec.py:decode", "box_frame": "normalized", "threshold": 0.4}}
    for named in ("dec.py:decode", "./dec.py:decode", f"{workdir}/dec.py:decode"):
        allow(named)   # the command line named it
        spec = spec_from_sidecar(side, named)
        assert spec.params.get("box_frame") == "normalized" and spec.threshold == 0.4, named
        assert with_decode(side, named)["decode"] == {"kind": named, "box_frame": "normalized", "threshold": 0.4}


def test_a_block_for_another_function_or_kind_is_not_taken():
    assert not same_ref("dec.py:decode", "dec.py:other")
    assert not same_ref("dec.py:decode", "dec:decode")
    assert not same_ref("threshold-map", "dec.py:decode")
    assert same_ref("pkg.mod:fn", "pkg.mod:fn") and not same_ref("pkg.mod:fn", "pkg.other:fn")
