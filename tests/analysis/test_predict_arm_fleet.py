"""predict_fleet covers arm64 hosts as well as x86 tiers: an ARM host's predicted class comes from the arm64
dispatch table, its HWCAP flags, the SVE/SME vector lengths and the thread count its fingerprint recorded, against
the measured ARM hosts (never the x86 ones). Expectations are the demo detector's measured hashes under qemu-user
(tests/predict_helpers.ARM_MEASURED, notes/emulated-hosts.md), not assumed."""

from __future__ import annotations

import pytest

from predict_helpers import ARM_MEASURED
from quantbench.analysis import predict as PR
from quantbench.inputs.assets import demo_model

ORT = "1.32.0"


def _info(cpu: str) -> dict:
    flags, sve, sme, _, _ = ARM_MEASURED[cpu]
    return {"arch": "aarch64", "isa_flags": list(flags), "sve_vector_bits": sve, "sme_vector_bits": sme,
            "ort_version": ORT, "session": {"intra_op_num_threads": 1}}


@pytest.mark.parametrize("variant,column", [("fp32", 3), ("dynamic", 4)])
def test_an_arm_host_is_predicted_from_the_measured_arm_hosts_as_its_hashes_say(variant, column):
    shown = {"pi": "cortex-a76", "graviton3": "neoverse-v1", "graviton4": "neoverse-n2"}
    targets = {"graviton2": "neoverse-n1", "pi4": "cortex-a72", "docker-arm64": "max,sme=off"}
    labels: dict = {}
    for h, cpu in shown.items():   # the measured classes: hosts with one hash share a label
        labels.setdefault(ARM_MEASURED[cpu][column], chr(65 + len(labels)))
    classes = [{"label": lab, "hosts": [h for h, cpu in shown.items() if ARM_MEASURED[cpu][column] == digest]}
               for digest, lab in labels.items()]
    x86 = {"arch": "x86_64", "isa_flags": ["avx2", "fma"], "ort_version": ORT, "session": {}}
    hosts = {**{h: _info(cpu) for h, cpu in shown.items()}, "x86": x86}
    variants = [{"model": "demo", "variant": variant, "path": str(demo_model("litter-detr-tiny")),
                 "classes": classes + [{"label": "X", "hosts": ["x86"]}]}]
    rows, notes = PR.predict_fleet(hosts, variants, {t: _info(cpu) for t, cpu in targets.items()}, ORT)
    got = {r["host"]: r["joins"] for r in rows}
    want = {t: labels.get(ARM_MEASURED[cpu][column]) for t, cpu in targets.items()}
    assert got == want
    assert any(v is not None for v in want.values()) and any(v is None for v in want.values())
    assert all("x86" not in r["like"] for r in rows)   # never stands on a host of another architecture
    assert len(notes) == 1 and "arm64 kernel dispatch" in notes[0] and "x86" not in notes[0].split("over ")[1]


def test_x86_tiers_and_arm_hosts_are_predicted_side_by_side():
    x86 = {"arch": "x86_64", "isa_flags": ["sse4_1", "sse4_2", "avx", "avx2", "fma"], "ort_version": ORT,
           "session": {}}
    hosts = {"x86": x86, "pi": _info("cortex-a76")}
    variants = [{"model": "demo", "variant": "fp32", "path": str(demo_model("litter-detr-tiny")),
                 "classes": [{"label": "A", "hosts": ["x86"]}, {"label": "B", "hosts": ["pi"]}]}]
    targets = {"x86-avx2": ["sse4_1", "sse4_2", "avx", "avx2", "fma"], "graviton2": _info("neoverse-n1")}
    rows, notes = PR.predict_fleet(hosts, variants, targets, ORT)
    assert {r["host"]: r["joins"] for r in rows} == {"x86-avx2": "A", "graviton2": "B"}
    assert len(notes) == 2
