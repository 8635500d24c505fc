"""equiv's `confirm`: a host predicted (by onnxruntime's kernel dispatch, from the fingerprint it reports in the
run) to share a class with a host run in full runs only a few fixtures, in the same run; byte-identical there, it
inherits the others, marked as inherited in the outputs table, the classes table, the report and the release (whose
verify re-measures them); when they differ it runs in full and the miss is kept. The rows never depend on the
fingerprints this machine remembers. Real runs on masked x86 tiers of this machine (CPUID faulting), the demo
classifier."""

from __future__ import annotations

import json
import shutil

import pytest

import quantbench
from quantbench import Fixtures, Fleet, Output
from quantbench.analysis import confirm as C
from quantbench.api import equiv as api_equiv
from quantbench.hosts.masked import here_features
from quantbench.store import partread

LIMIT = 8
K = 2
# Two masked tiers of one kernel class on any CPU with AVX2+FMA (x86 itself may be an AVX-512 or VNNI class here):
# ANCHOR runs in full, JOINER is predicted to share its class.
ANCHOR, JOINER = "x86-avx2", "x86-zen2"
PAIR = f"{ANCHOR},{JOINER}"


def _needs_avx2() -> None:
    """The AVX2 tiers show this CPU's own AVX2+FMA kernels (masked), x86-sse4 other ones: derived from here."""
    if not {"avx2", "fma"} <= set(here_features()):
        pytest.skip("this CPU shows no AVX2+FMA: x86-avx2 and x86-zen2 are not masked views of it")


def _demo_variants(root):
    """fp32 + dynamic int8 of the bundled demo classifier, sidecar beside each, as a variants folder."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from quantbench.inputs.assets import demo_model
    from quantbench.inputs.sidecarfile import load_sidecar
    from quantbench.inputs.variantdir import Variant, write_index

    src = demo_model("litter-cnn")
    side = load_sidecar(src)
    vdir = root / "variants" / "litter-cnn"
    vdir.mkdir(parents=True)
    shutil.copyfile(src, vdir / "fp32.onnx")
    # from the copy: the quantizer writes `<input>-inferred.onnx` beside its input (never into the package)
    quantize_dynamic(str(vdir / "fp32.onnx"), str(vdir / "dynamic.onnx"), weight_type=QuantType.QInt8)
    vs = []
    for name in ("fp32", "dynamic"):
        recipe = {"variant": name, "method": name, "model": "litter-cnn", "sidecar": side,
                  "source_model": {"path": f"bundled:models/{src.name}"}}
        (vdir / f"{name}.recipe.json").write_text(json.dumps(recipe))
        (vdir / f"{name}.json").write_text(json.dumps(side))
        vs.append(Variant(name=name, path=vdir / f"{name}.onnx", model="litter-cnn", recipe=recipe))
    write_index(vdir, vs)
    return vdir


def _equiv(vdir, hosts: str, confirm, limit: int = LIMIT):
    return quantbench.equiv([str(vdir)], fleet=Fleet(hosts), fixtures=Fixtures(limit=limit), plots=False,
                            output=Output(progress=False), confirm=confirm)


def _remember(workdir, vdir, hosts: str, monkeypatch) -> None:
    """The hosts fingerprinted once and remembered (a one-fixture run in another folder)."""
    warm = workdir / "warm"
    warm.mkdir()
    monkeypatch.chdir(warm)
    _equiv(vdir, hosts, "all", limit=1)
    monkeypatch.chdir(workdir)


def _outputs(workdir) -> list[dict]:
    return partread.read("outputs", root=workdir / "results" / "tables",
                         columns=["host", "variant", "fixture_id", "inherited"]).to_pylist()


@pytest.mark.slow
def test_a_confirmed_host_inherits_marked_rows_and_a_release_re_measures_them(workdir, monkeypatch):
    _needs_avx2()
    vdir = _demo_variants(workdir)
    runs = []
    real_run_plan = api_equiv.run_plan

    def counted(*args, **kwargs):
        runs.append(1)
        return real_run_plan(*args, **kwargs)

    monkeypatch.setattr(api_equiv, "run_plan", counted)
    done = _equiv(vdir, PAIR, K)
    assert len(runs) == 1   # the predicted host confirmed within the one run
    assert done.analysis.inherited == {JOINER: {"fp32": ANCHOR, "dynamic": ANCHOR}}
    assert done.analysis.prediction_misses == []
    rows = _outputs(workdir)
    for variant in ("fp32", "dynamic"):
        mine = [r for r in rows if r["host"] == JOINER and r["variant"] == variant]
        measured = {r["fixture_id"] for r in mine if r["inherited"] is None}
        inherited = {r["fixture_id"] for r in mine if r["inherited"] == ANCHOR}
        # fresh tables: no earlier analysis ranks the fixtures, so the first K by fixture id ran
        assert len(measured) == K and len(inherited) == LIMIT - K and not measured & inherited
    classes = done.classes.to_pylist()
    assert {(c["variant"], tuple(c["hosts"])) for c in classes} == {("fp32", (ANCHOR, JOINER)), ("dynamic", (ANCHOR, JOINER))}
    assert all(c["inherited_hosts"] == [JOINER] for c in classes)
    report = (workdir / "results" / "report.md").read_text()
    assert f"{ANCHOR}, {JOINER} (inherited)" in report and f"inherited from {ANCHOR}" in report

    quantbench.make_release("v1", variants=str(vdir))
    record = json.loads((workdir / "results" / "releases" / "v1" / "release.json").read_text())
    for v in record["variants"]:
        [t] = [t for t in v["targets"] if t["host"] == JOINER]
        assert t["inherited"] == {"fixtures": LIMIT - K, "from": [ANCHOR]} and t["measured_fixtures"] == K
        [anchor] = [t for t in v["targets"] if t["host"] == ANCHOR]
        assert anchor["inherited"] is None and anchor["measured_fixtures"] == LIMIT
    checked = quantbench.verify(str(workdir / "results" / "releases" / "v1"), host=JOINER, sample=3)
    reruns = [c for c in checked.checks if c.check == "re-run"]
    assert checked.passed and len(reruns) == 2
    assert all(f"3 of them inherited in the record, measured on {JOINER} now" in c.detail for c in reruns)

    again = _equiv(vdir, PAIR, "all")   # every fixture measured: nothing inherited any more
    assert f"{JOINER} {2 * (LIMIT - K)} ran" in again.run_line
    assert again.analysis.inherited == {} and all(c["inherited_hosts"] is None for c in again.classes.to_pylist())
    assert [(c["variant"], c["hosts"]) for c in again.classes.to_pylist()] == [(c["variant"], c["hosts"]) for c in classes]


@pytest.mark.slow
def test_a_host_wrongly_predicted_to_join_runs_in_full_and_the_miss_is_kept(workdir, monkeypatch):
    _needs_avx2()
    vdir = _demo_variants(workdir)
    info = C.host_info

    def stale(fingerprint, session):
        """x86-sse4's fingerprint read as this CPU's AVX2+FMA (a predictor wrong about it): it joins x86."""
        got = info(fingerprint, session)
        return dict(got, isa_flags=sorted(set(got["isa_flags"]) | set(here_features())))

    monkeypatch.setattr(C, "host_info", stale)
    done = _equiv(vdir, "x86,x86-sse4", K)
    missed = {m["variant"] for m in done.analysis.prediction_misses}
    # SSE4's fp32 kernels (no FMA, 4-wide) give other bytes than AVX2+FMA on every input
    assert "fp32" in missed and all(m["host"] == "x86-sse4" and m["anchor"] == "x86"
                                    for m in done.analysis.prediction_misses)
    rows = _outputs(workdir)
    for variant in missed:
        mine = [r for r in rows if r["host"] == "x86-sse4" and r["variant"] == variant]
        assert {r["inherited"] for r in mine} == {None} and len({r["fixture_id"] for r in mine}) == LIMIT
    assert "x86-sse4" not in done.analysis.inherited or set(done.analysis.inherited["x86-sse4"]).isdisjoint(missed)
    equiv_json = json.loads((workdir / "results" / "equiv.json").read_text())
    assert {m["variant"] for m in equiv_json["prediction_misses"]} == missed
    fp32 = [c["hosts"] for c in done.classes.to_pylist() if c["variant"] == "fp32"]
    assert fp32 == [["x86"], ["x86-sse4"]]


@pytest.mark.slow
def test_the_same_rows_whether_or_not_this_machine_remembers_the_fingerprints(workdir, monkeypatch):
    _needs_avx2()
    vdir = _demo_variants(workdir)

    def rows_in(folder):
        folder.mkdir()
        monkeypatch.chdir(folder)
        done = _equiv(vdir, PAIR, K)
        monkeypatch.chdir(workdir)
        seen[folder.name] = done.analysis.prediction_misses   # what a failure says: a miss, or no prediction
        return done.analysis.inherited, sorted((r["host"], r["variant"], r["fixture_id"], r["inherited"] or "")
                                               for r in _outputs(folder))

    seen: dict = {}

    monkeypatch.setenv("QUANTBENCH_FINGERPRINT_CACHE", "0")   # nothing remembered, nothing kept
    never = rows_in(workdir / "never")
    monkeypatch.delenv("QUANTBENCH_FINGERPRINT_CACHE")
    _remember(workdir, vdir, PAIR, monkeypatch)
    remembered = rows_in(workdir / "remembered")
    assert never == remembered and never[0] == {JOINER: {"fp32": ANCHOR, "dynamic": ANCHOR}}, seen


@pytest.mark.slow
def test_an_emulated_arm_host_confirms_on_its_anchor_in_the_same_run(workdir):
    """graviton2 (a Neoverse N1) and pi (a Cortex-A76) under qemu arm64: one onnxruntime, 4 threads, the same
    features for its kernels, so graviton2 is predicted to share pi's class, confirms on K fixtures and inherits
    the others, all in one run."""
    vdir = _demo_variants(workdir)
    done = _equiv(vdir, "pi,graviton2", K, limit=4)
    assert done.analysis.inherited == {"graviton2": {"fp32": "pi", "dynamic": "pi"}}
    assert done.analysis.prediction_misses == []
    rows = _outputs(workdir)
    for variant in ("fp32", "dynamic"):
        mine = [r for r in rows if r["host"] == "graviton2" and r["variant"] == variant]
        assert sum(r["inherited"] is None for r in mine) == K and sum(r["inherited"] == "pi" for r in mine) == 4 - K


@pytest.mark.slow
def test_by_default_a_predicted_host_confirms_and_the_same_command_again_ends_reusing_everything(workdir):
    """The default is K = 2 (measured: docs/benchmarks.md); a rerun measures at most the K confirming fixtures per
    host and variant that the earlier analysis now ranks first, and once those are measured nothing more."""
    _needs_avx2()
    vdir = _demo_variants(workdir)

    def default_run():
        return quantbench.equiv([str(vdir)], fleet=Fleet(PAIR), fixtures=Fixtures(limit=LIMIT), plots=False,
                                output=Output(progress=False))

    first = default_run()
    assert C.DEFAULT_CONFIRM == K
    assert first.analysis.inherited == {JOINER: {"fp32": ANCHOR, "dynamic": ANCHOR}}
    assert f"{JOINER} {2 * K} ran" in first.run_line and f"{ANCHOR} {2 * LIMIT} ran" in first.run_line
    second = default_run()
    ran = int(second.run_line.split(f"{JOINER} ")[1].split(" ran")[0])
    assert ran <= 2 * K and f"{ANCHOR} 0 ran" in second.run_line
    third = default_run()
    assert f"{JOINER} 0 ran" in third.run_line and f"{ANCHOR} 0 ran" in third.run_line
    for later in (second, third):
        assert later.analysis.inherited == first.analysis.inherited and later.analysis.prediction_misses == []
        assert ([(c["variant"], c["hosts"]) for c in later.classes.to_pylist()]
                == [(c["variant"], c["hosts"]) for c in first.classes.to_pylist()])
    rows = _outputs(workdir)
    for variant in ("fp32", "dynamic"):   # one row per fixture the host has: measured, else inherited
        mine = [r for r in rows if r["host"] == JOINER and r["variant"] == variant]
        assert {r["fixture_id"] for r in mine} == {r["fixture_id"] for r in rows
                                                   if r["host"] == ANCHOR and r["variant"] == variant}
