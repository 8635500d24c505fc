"""The commissioning kit (`quantbench commission`, quantbench.release.commission): check.py run as a device runs
it (its own process, quantbench made unimportable), natively, under a masked x86 tier and in the emulated Pi's
guest Python; a changed kit file exits 2; bad input is one line, exit 2, nothing written; same inputs, same bytes.

The results are release_helpers' tiny classifier (fp32 + dynamic) measured on x86 alone over 5 images."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantbench.cli import main
from release_helpers import DEVICE, commission, make_release_results, run_check
from setup_required import need_tier


def digests(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_check_passes_natively_with_the_class_equiv_measured(results, tmp_path, capsys):
    assert commission(results, tmp_path / "kit", "--variant", "fp32", "--count", "4") == 0
    assert "4 fixtures, 1 measured class(es): A (x86)" in capsys.readouterr().out
    r = run_check(tmp_path / "kit")
    assert (r.returncode, r.stdout) == (0, "PASS: identical to class A (x86): 4 of 4 fixtures\n"), r.stderr
    r = run_check(tmp_path / "kit", "--json")
    got = json.loads(r.stdout)
    assert r.returncode == 0 and got["result"] == "PASS" and got["hosts"] == ["x86"]
    assert got["device"]["arch"] == "x86_64" and "avx2" in got["device"]["cpu_flags"]
    assert got["device"]["sve_vector_length"] is None


def test_the_kit_holds_what_a_device_needs(results, tmp_path):
    assert commission(results, tmp_path / "kit", "--variant", "dynamic", "--count", "3") == 0
    kit = tmp_path / "kit"
    assert sorted(digests(kit)) == ["check.py", "expected.json", "fixtures/01.bin", "fixtures/02.bin",
                                    "fixtures/03.bin", "model.onnx"]
    exp = json.loads((kit / "expected.json").read_text())
    (cls,) = exp["classes"]
    assert [h["host"] for h in cls["hosts"]] == ["x86"] and cls["hosts"][0]["fingerprint"]["arch"] == "x86_64"
    assert cls["hosts"][0]["session"]["providers"] == ["CPUExecutionProvider"]
    assert len(cls["outputs"]) == 3 and all(set(o) == {"logits"} for o in cls["outputs"])
    # the classifier's argmax is a built-in simple rule: its served decisions are recorded, one per fixture
    assert exp["decode"]["decoder"] == "decode_classifier" and len(cls["decisions"]) == 3
    assert all(len(d["served"]) == 1 for d in cls["decisions"])
    # nearest the decision boundary first (no class separated anything: one class)
    assert [f["why"].split(" (")[0] for f in exp["fixtures"]] == ["near the threshold"] * 3
    src = (kit / "check.py").read_text()
    assert "import quantbench" not in src and "from quantbench" not in src.split("SOURCES.update")[0]


@pytest.mark.parametrize("member", ["model.onnx", "fixtures/01.bin", "expected.json"])
def test_a_changed_byte_in_the_kit_exits_2(results, tmp_path, member):
    kit = tmp_path / "kit"
    assert commission(results, kit, "--variant", "fp32", "--count", "2") == 0
    data = bytearray((kit / member).read_bytes())
    data[len(data) // 2] ^= 0x01
    (kit / member).write_bytes(bytes(data))
    r = run_check(kit)
    assert r.returncode == 2 and r.stdout.startswith("ERROR: ") and member.split("/")[0] in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("\n") == 1 and "Traceback" not in r.stderr


def test_same_inputs_give_the_same_kit_bytes(results, tmp_path):
    assert commission(results, tmp_path / "a", "--variant", "fp32", "--count", "3") == 0
    assert commission(results, tmp_path / "b", "--variant", "fp32", "--count", "3") == 0
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    assert commission(results, tmp_path / "a", "--variant", "fp32", "--count", "3", "--force") == 0
    assert digests(tmp_path / "a") == digests(tmp_path / "b")


@pytest.mark.parametrize("argv, words", [
    (["--variant", "nosuch"], "--variant nosuch: no equiv analysis ran it (analysed: tiny/dynamic, tiny/fp32)"),
    (["--variant", "fp32", "--count", "0"], "--count 0: must be a whole number of fixtures, at least 1"),
    (["--variant", "fp32", "--out", "{results}/variants/tiny/kit"], "is inside the variants folder"),
    (["--variant", "fp32", "--out", "{tmp}/full"], "exists and is not empty; --force replaces an earlier kit"),
    (["--variant", "fp32", "--out", "{tmp}/full", "--force"], "holds no commissioning kit"),
])
def test_bad_input_is_one_line_and_writes_nothing(results, tmp_path, capsys, argv, words):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep me")
    argv = [a.format(results=results, tmp=tmp_path) for a in argv]
    before = digests(tmp_path)
    out = [] if "--out" in argv else ["--out", str(tmp_path / "kit")]
    assert main(["commission", "--results", str(results), *out, *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert digests(tmp_path) == before and not (tmp_path / "kit").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no staging folder left


def test_no_equiv_yet_is_one_line(tmp_path, capsys):
    assert main(["commission", "--results", str(tmp_path / "results"), "--variant", "fp32",
                 "--out", str(tmp_path / "kit")]) == 2
    err = capsys.readouterr().err
    assert "no equiv analysis in" in err and err.count("\n") == 1 and not (tmp_path / "kit").exists()


def _kit_fixtures(kit: Path) -> list:
    """The kit's fixtures as the worker takes them (explain_helpers.fixture), from its files."""
    import numpy as np

    from explain_helpers import fixture

    exp = json.loads((kit / "expected.json").read_text())
    return [fixture(np.frombuffer((kit / f["file"]).read_bytes(), f["dtype"]).reshape(f["shape"]), f["input_name"])
            for f in exp["fixtures"]]


@pytest.mark.parametrize("tier", ["x86-avx2", "x86-sse4"])
def test_under_a_masked_tier_the_release_did_not_measure_check_says_what_its_bytes_say(results, tmp_path, tier):
    """Measured on x86 alone; check.py run under a whole-process CPUID mask (`hosts exec`, as a user runs a script
    there): PASS exactly when quantbench's own worker on that tier gives x86's bytes, NEW CLASS otherwise. Which one
    follows from the CPU: without FMA (x86-sse4 on a CPU that has it) the fp32 convolution rounds differently."""
    from quantbench.hosts import masked as M
    from tier_helpers import output_hashes

    need_tier(tier)
    kit = tmp_path / "kit"
    assert commission(results, kit, "--variant", "fp32", "--count", "3") == 0
    exp = json.loads((kit / "expected.json").read_text())
    measured = [sha for per in exp["classes"][0]["outputs"] for sha in per.values()]
    same = output_hashes(tier, {"fp32": kit / "model.onnx"}, _kit_fixtures(kit))["fp32"] == measured
    if "fma" in M.here_features() and tier == "x86-sse4":
        assert not same
    r = run_check(kit, prefix=(sys.executable, "-m", "quantbench", "hosts", "exec", "--no-progress", tier, "--",
                               sys.executable))
    if same:
        assert (r.returncode, r.stdout) == (0, "PASS: identical to class A (x86): 3 of 3 fixtures\n"), r.stderr
    else:
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stdout.startswith("NEW CLASS: matches no measured class; first differs on fixture "), r.stdout
        assert r.stdout.rstrip().endswith("of 3 fixtures differ from class A")
    r = run_check(kit, "--json", prefix=(sys.executable, "-m", "quantbench", "hosts", "exec", "--no-progress", tier,
                                         "--", sys.executable))
    device = json.loads(r.stdout)["device"]
    assert device["cpu_mechanism"] == "native-masked" and ("avx2" in device["cpu_flags"]) == (tier == "x86-avx2")


@pytest.fixture(scope="module")
def pi_results(tmp_path_factory):
    """The tiny classifier's results after `equiv --hosts x86,pi` (the emulated Pi 5 under qemu)."""
    import contextlib

    from quantbench.hosts import emulated as E
    from setup_required import missing_setup

    ok, msg = E.ready("pi")
    if not ok:
        missing_setup(f"pi not set up: {msg}")
    root = tmp_path_factory.mktemp("commission-pi")
    results = make_release_results(root, "doc")
    with contextlib.chdir(root):
        assert main(["equiv", "--hosts", "x86,pi", "--fixtures", "labels.json", "--no-plots", "--no-progress"]) == 0
    return results


@pytest.mark.slow
def test_check_passes_in_the_emulated_pis_guest_python_with_the_pis_class(pi_results, tmp_path):
    """check.py in the emulated Pi's own Python (arm64 numpy and onnxruntime, no quantbench): PASS with the class equiv
    put the Pi in, under the Pi's recorded session (its deployed threads)."""
    from quantbench.hosts import emulated as E

    kit = tmp_path / "kit"
    assert commission(pi_results, kit, "--variant", "fp32", "--count", "3") == 0
    exp = json.loads((kit / "expected.json").read_text())
    pi_class = next(c for c in exp["classes"] if "pi" in [h["host"] for h in c["hosts"]])
    if len(exp["classes"]) > 1:   # x86 and the Pi apart: a fixture that separates them comes first
        assert exp["fixtures"][0]["why"] == "separates classes"
    argv, env = E.python_command("pi")
    r = run_check(kit, "--json", prefix=tuple(argv[:-1]) if argv[-1] == "-u" else tuple(argv), env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    got = json.loads(r.stdout)
    hosts = [h["host"] for h in pi_class["hosts"]]
    assert (got["result"], got["class"], got["hosts"]) == ("PASS", pi_class["label"], hosts)
    assert got["device"]["arch"] == "aarch64" and "asimddp" in got["device"]["cpu_flags"]   # a Cortex-A76
    assert got["device"]["cpu_mechanism"] == "qemu"


def test_a_release_carries_a_kit_per_variant_and_verify_checks_it(results, tmp_path):
    from release_helpers import release

    assert release(results, "v1", "--archive") == 0
    rel = results / "releases" / "v1"
    rec = json.loads((rel / "release.json").read_text())
    assert [k["folder"] for k in rec["kits"]] == ["kits/fp32", "kits/dynamic"]
    exp = json.loads((rel / "kits" / "fp32" / "expected.json").read_text())
    assert exp["model"]["file"] == "../../artifacts/fp32.onnx"   # the release's artifact, by reference
    assert not (rel / "kits" / "fp32" / "model.onnx").exists()
    r = run_check(rel / "kits" / "fp32")
    assert (r.returncode, r.stdout) == (0, "PASS: identical to class A (x86): 5 of 5 fixtures\n"), r.stderr
    for target in (str(rel), str(results / "releases" / "v1.tar.gz")):
        assert main(["verify", target, "--results", str(results)]) == 0
    fx = rel / "kits" / "dynamic" / "fixtures" / "01.bin"
    fx.write_bytes(fx.read_bytes()[:-1] + bytes([fx.read_bytes()[-1] ^ 1]))
    assert main(["verify", str(rel), "--results", str(results), "--json"]) == 1
    assert run_check(rel / "kits" / "dynamic").returncode == 2


def test_a_kit_of_a_release_without_artifacts_takes_the_model_by_hash(results, tmp_path):
    from release_helpers import release

    assert release(results, "v2", "--no-retain") == 0
    kit = results / "releases" / "v2" / "kits" / "fp32"
    r = run_check(kit)
    assert r.returncode == 2 and "names its model by SHA-256" in r.stdout, r.stdout + r.stderr
    model = str(results / "variants" / "tiny" / "fp32.onnx")
    r = run_check(kit, "--model", model)
    assert r.returncode == 0 and r.stdout.startswith("PASS: identical to class A (x86)"), r.stdout + r.stderr
    r = run_check(kit, "--model", str(results / "variants" / "tiny" / "dynamic.onnx"))
    assert r.returncode == 2 and "model" in r.stdout


def test_a_device_without_onnxruntime_gets_one_line_and_exit_2(results, tmp_path):
    kit = tmp_path / "kit"
    assert commission(results, kit, "--variant", "fp32", "--count", "2") == 0
    r = subprocess.run([sys.executable, "-c", DEVICE.replace("sys.modules['quantbench'] = None",
                                                             "sys.modules['onnxruntime'] = None"), str(kit / "check.py")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and r.stdout.startswith("ERROR: missing runtime: ") and r.stdout.count("\n") == 1, r
    assert "Traceback" not in r.stderr


def _python_3_8():
    """A Python 3.8 interpreter that runs (on PATH, or one pyenv installed), else None."""
    import shutil

    found = [shutil.which("python3.8"), *sorted(map(str, Path.home().glob(".pyenv/versions/3.8*/bin/python3.8")))]
    for exe in filter(None, found):
        if subprocess.run([exe, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
                          capture_output=True, timeout=60).returncode == 0:
            return exe
    return None


def test_check_runs_on_python_3_8(results, tmp_path):
    """The oldest Python a kit promises: check.py and every source it carries compile there, and without numpy it
    says so (one line, exit 2). A machine without a Python 3.8 cannot show it."""
    py38 = _python_3_8()
    if py38 is None:
        pytest.skip("no Python 3.8 on this machine")
    kit = tmp_path / "kit"
    assert commission(results, kit, "--variant", "fp32", "--count", "2") == 0
    code = ("import runpy, sys; ns = runpy.run_path(sys.argv[1], run_name='kit'); "
            "[compile(src, name, 'exec') for name, src in ns['SOURCES'].items()]; print(sorted(ns['SOURCES']))")
    r = subprocess.run([py38, "-c", code, str(kit / "check.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == str(["decode.py", "quantbench.tensorcode", "quantbench.worker.fingerprint",
                                                      "quantbench.worker.jobs", "quantbench.worker.protocol",
                                                      "quantbench.worker.session"]), r.stderr
    r = subprocess.run([py38, "-c", "import numpy"], capture_output=True, timeout=300)
    if r.returncode == 0:
        return   # this 3.8 has numpy: the missing-runtime line is shown by the test above
    r = subprocess.run([py38, str(kit / "check.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout.startswith("ERROR: missing runtime: "), r.stdout + r.stderr


def test_the_fixtures_alternate_those_separating_classes_and_those_nearest_the_threshold():
    from quantbench.release.commission import choose_fixtures

    ids = ["a", "b", "c", "d", "e"]
    one = {f: {"out": f} for f in ids}
    other = {f: {"out": "x" if f in ("d", "e") else f} for f in ids}   # the classes differ on d and e only
    margins = {"a": 0.5, "b": 0.01, "c": 0.2, "d": 0.3, "e": 0.4}
    assert choose_fixtures(ids, [one, other], margins, 4) == [
        ("d", "separates classes"), ("b", "near the threshold (margin 0.01)"), ("e", "separates classes"),
        ("c", "near the threshold (margin 0.2)")]
    assert [f for f, _ in choose_fixtures(ids, [one], {}, 9)] == ids   # no decisions, one class: by id, all of them
