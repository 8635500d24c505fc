"""The ARM provider study (seed 004) reproduced by quantbench itself, on the demo classifier (litter-cnn):

    quantbench calibrate --model litter-cnn
    quantbench equiv --hosts pi,pi4,pi3,graviton2,pi-xnnpack,pi-debian,pi4-debian --variants fp32 static-minmax

fp32 on the CPU provider at equal threads is one class across Cortex-A53/A72/A76 and Neoverse-N1 (pip's
onnxruntime and Debian's 1.21 alike), XNNPACK on the A76 is its own class, static QDQ int8 is one class for
every ARM host and provider, and Debian's 1.21 on the A72 (a Pi 4) does not start, with the reason.
"""

from __future__ import annotations

import json

from quantbench.cli import main
from quantbench.hosts.registry import make_host, resolve_hosts
from setup_required import missing_setup

CPU_HOSTS = ["pi", "pi4", "pi3", "graviton2", "pi-debian"]


def test_the_arm_provider_study_reproduces(workdir, capsys):
    for spec in resolve_hosts(CPU_HOSTS + ["pi-xnnpack"]):
        ok, msg = make_host(spec).ready()
        if not ok:
            missing_setup(f"host {spec.name}: {msg}")
    (workdir / "quantbench.toml").write_text(
        'pi4-debian = { kind = "emulated", preset = "pi4", runtime = "debian:trixie" }\n')
    assert main(["calibrate", "--model", "litter-cnn", "--no-progress"]) == 0
    capsys.readouterr()
    variants = workdir / "results" / "variants" / "litter-cnn"
    assert main(["equiv", "--hosts", ",".join(CPU_HOSTS + ["pi-xnnpack", "pi4-debian"]), "--variants",
                 str(variants / "fp32.onnx"), str(variants / "static-minmax.onnx"), "--limit", "2",
                 "--no-progress", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    classes = {v["variant"]: [c["hosts"] for c in v["classes"]] for v in out["variants"]}
    assert classes["fp32"] == [CPU_HOSTS, ["pi-xnnpack"]]
    assert classes["static-minmax"] == [CPU_HOSTS + ["pi-xnnpack"]]
    assert out["not_started"] == {"pi4-debian": "onnxruntime 1.21.0 does not start on Cortex-A72: SIGILL at import"}
    report = (workdir / "results" / "report.md").read_text()
    assert "- pi4-debian: onnxruntime 1.21.0 does not start on Cortex-A72: SIGILL at import" in report
