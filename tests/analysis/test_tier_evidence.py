"""The emulated Graviton3 (Neoverse-V1) against the Cortex-A76 Pi 5 on the demo detector, fp32, one fixture:
the classes name the flags onnxruntime's dispatch reads (before: "isa:asimdfhm", one arbitrary flag of many),
and with qemu kernel evidence the one the kernels used: MLAS's SVE kernels ran on graviton3 only."""

import contextlib
import json
from pathlib import Path

import pytest

from quantbench.inputs.assets import demo_model
from quantbench.cli import main
from quantbench.explain.evidence import run_evidence_for
from quantbench.inputs.fixtures import fixtures_for_variants
from quantbench.hosts import emulated as EM
from quantbench.hosts.registry import parse_hosts
from quantbench.inputs.variantdir import resolve_variants
from setup_required import missing_setup


def _fp32(capsys) -> dict:
    capsys.readouterr()
    assert main(["equiv", "--hosts", "pi,graviton3", "--variants", str(demo_model()), "--limit", "1",
                 "--no-progress", "--no-plots", "--json"]) == 0
    out = capsys.readouterr().out
    [v] = json.loads(out[out.index("{"):])["variants"]
    return v


@pytest.mark.slow
def test_graviton3_split_names_dispatch_flags_and_the_kernels_sve(tmp_path, capsys):
    for name in ("pi", "graviton3"):
        ok, msg = EM.ready(name)
        if not ok:
            missing_setup(f"{name} not set up: {msg}")
    with contextlib.chdir(tmp_path):
        v = _fp32(capsys)
        assert [c["hosts"] for c in v["classes"]] == [["pi"], ["graviton3"]]
        # fp32 runs no integer kernel: the int8-only flags (i8mm) rank last and SVE separates
        assert v["separating_features"] == ["isa:sve"]
        s = v["separation"]
        assert s["features"][0] == "isa:sve" and set(s["features"][-2:]) == {"isa:i8mm", "isa:svei8mm"}
        assert sorted(s["features"]) == ["isa:bf16", "isa:i8mm", "isa:sve", "isa:svei8mm", "sve_vector_bits"]
        assert s["others"] > 0 and s["kernels"] == []
        # qemu's translation log of the same fixture on graviton3: SVE instructions inside onnxruntime
        [variant] = resolve_variants([str(demo_model())])
        fixtures, _ = fixtures_for_variants([variant], None, None, "eval", 1, None)
        [ev], _ = run_evidence_for(variant, parse_hosts("graviton3"), fixtures, Path("results/tables"))
        assert ev.families["SVE"].sites > 0
        v = _fp32(capsys)
        assert v["separating_features"] == ["isa:sve"]
        assert v["separation"]["features"] == s["features"] and v["separation"]["others"] == s["others"]
        assert v["separation"]["kernels"][0] == {"feature": "isa:sve", "families": ["SVE"], "hosts": ["graviton3"],
                                                 "separates": True}
        report = (tmp_path / "results" / "report.md").read_text()
        assert ", ".join(s["features"]) + " and " in report
        assert "kernels used (qemu evidence): isa:sve (SVE on graviton3)" in report
