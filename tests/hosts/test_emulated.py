"""Emulated hosts: setup contract, guest CPU identity, and ARM equivalence on the demo classifier.

The slow tests need `quantbench hosts setup pi pi4 x86-avx2` (`scripts/setup.sh --for-tests` runs
`--all`); they are skipped with the readiness message when it has not been run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from quantbench.errors import UserError
from quantbench.hosts import emulated as E
from quantbench.hosts.setup import apt, prefix, steps
from quantbench import worker as W
from quantbench import tensorcode
from quantbench.store import partread
from quantbench.hosts.keys import local_ort_version
from setup_required import missing_setup

WORKER_ENTRY = Path(W.jobs.__file__).resolve()   # run in the guest with its sibling sources


# --------------------------------------------------------------------------- fast: contract


def test_presets_contract():
    assert set(E.PRESETS) >= {"pi", "pi4", "pi3", "graviton2", "graviton3", "x86-avx2", "x86-sse4"}
    parts = {n: E.PRESETS[n].part for n in ("pi", "pi4", "pi3", "graviton2")}
    assert parts == {"pi": 0xd0b, "pi4": 0xd08, "pi3": 0xd03, "graviton2": 0xd0c}
    assert E.PRESETS["graviton3"].min_qemu >= (8, 1, 0)
    assert {p.arch for p in E.PRESETS.values()} == {"aarch64", "x86_64"}
    for p in E.PRESETS.values():
        assert p.fingerprint_hint and p.description and p.qemu_cpu


def test_wheel_folders_are_keyed_by_the_full_onnxruntime_version(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path))
    assert E.site_dir("1.32.0") != E.site_dir("1.32.1")
    assert E.site_stamp("1.32.0").name == E.site_dir("1.32.0").name + ".json"
    assert E.site_stamp("1.32.0") != E.site_stamp("1.32.1")


def test_missing_setup_names_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))  # no qemu on PATH either
    for name in E.PRESETS:
        ok, msg = E.ready(name)
        assert not ok
        assert f"run `quantbench hosts setup {name}`" in msg
        assert f"qemu-{E.PRESETS[name].arch}" in msg
        with pytest.raises(UserError, match=f"quantbench hosts setup {name}"):
            E.python_command(name)


@pytest.mark.slow   # runs qemu-aarch64 for its version
def test_missing_root_and_old_qemu_are_named(tmp_path, monkeypatch):
    """With a qemu in place but nothing else: the root is named; graviton3 needs qemu >= 8.1."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for arch in ("aarch64", "x86_64"):  # a stand-in reporting Debian 12's qemu version
        f = bin_dir / f"qemu-{arch}"
        f.write_text("#!/bin/sh\necho 'qemu-%s version 7.2.22 (Debian 1:7.2+dfsg-7)'\n" % arch)
        f.chmod(0o755)
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(bin_dir))
    ok, msg = E.ready("pi")
    assert not ok and "arm64 root is missing" in msg and "quantbench hosts setup pi`" in msg
    ok, msg = E.ready("graviton3")
    assert not ok and "needs qemu >= 8.1.0" in msg and "7.2.22" in msg
    ok, msg = E.ready("x86-avx2")
    assert not ok and "prefix for x86-avx2 is missing" in msg
    assert E.qemu_version(bin_dir / "qemu-aarch64") == (7, 2, 22)


@pytest.mark.slow   # runs qemu-aarch64 for its version
def test_a_binary_that_prints_no_version_is_no_qemu(tmp_path):
    fake = tmp_path / "qemu-aarch64"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    with pytest.raises(UserError, match=r"qemu-aarch64: not a qemu binary \(asked for its version, it printed none\)$"):
        E.qemu_version(fake)


def test_setup_unknown_preset_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path))
    with pytest.raises(UserError, match="unknown emulated preset 'pi9'.*presets: pi, pi4"):
        steps.setup_emulated([("pi9", None)], progress=False)
    assert steps.setup_emulated([], progress=False) == []


def test_mirror_comes_from_the_machines_apt_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("QUANTBENCH_DEBIAN_MIRROR", raising=False)
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text("# nothing here\n")
    (etc / "sources.list.d" / "vendor.sources").write_text(
        "Types: deb\nURIs: https://vendor.invalid/apt\nSuites: nodistro\nComponents: main\n")
    (etc / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.invalid/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /some/keyring.gpg\n")
    assert apt.debian_mirror(etc) == ("http://mirror.invalid/debian", "/some/keyring.gpg")
    (etc / "sources.list.d" / "debian.sources").unlink()
    (etc / "sources.list").write_text("deb [arch=amd64] http://other.invalid/debian trixie main contrib\n")
    assert apt.debian_mirror(etc)[0] == "http://other.invalid/debian"
    (etc / "sources.list").write_text("")
    with pytest.raises(UserError, match="QUANTBENCH_DEBIAN_MIRROR"):
        apt.debian_mirror(etc)


def test_generated_cpuinfo_reads_back_through_the_worker():
    p = E.PRESETS["pi"]
    text = prefix.arm_cpuinfo(p, prefix.arm_features(0b111 | (1 << 20), 0), cpus=2)
    info = W.read_cpuinfo(text)
    assert info["arm_cores"] == [{"CPU implementer": "0x41", "CPU architecture": "8", "CPU variant": "0x4",
                                  "CPU part": "0xd0b", "CPU revision": "1"}]
    assert info["features"] == ["asimd", "asimddp", "evtstrm", "fp"]
    # CPUID of a Haswell-like model: AVX2 + FMA, no AVX-512.
    cpuid = {"0.0": [0xd, 0x756E6547, 0x6C65746E, 0x49656E69], "1.0": [0x306c1, 0, (1 << 12) | (1 << 28) | (1 << 20), 1 << 26],
             "7.0": [0, 1 << 5, 0, 0]}
    text, flags = prefix.x86_cpuinfo(cpuid, cpus=1)
    info = W.read_cpuinfo(text)
    assert info["vendor_id"] == "GenuineIntel" and info["cpu family"] == "6" and info["model"] == "60"
    assert set(flags) == {"sse2", "fma", "sse4_2", "avx", "avx2"} and info["flags"] == sorted(flags)


# --------------------------------------------------------------------------- slow: real qemu


def _need(*names):
    for name in names:
        ok, msg = E.ready(name)
        if not ok:
            missing_setup(f"{name} not set up: {msg}")


def _guest_fingerprint(name: str) -> dict:
    argv, env = E.python_command(name)
    code = ("import json, runpy; worker = runpy.run_path(%r, init_globals={'_SOURCES': None}); "
            "print('FP ' + json.dumps(worker['collect_fingerprint']()))" % str(WORKER_ENTRY))
    proc = subprocess.run(argv + ["-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("FP "))
    return json.loads(line[3:])["identity"]


def _check_arm_identity(name: str, fp: dict) -> None:
    """The guest's /proc/cpuinfo MIDR and HWCAP are the preset's (read by the worker's fingerprint)."""
    p = E.PRESETS[name]
    assert fp["arch"] == "aarch64"
    assert fp["onnxruntime"]["version"] == local_ort_version()
    assert fp["cpu"]["cores"] == [{"CPU implementer": "0x41", "CPU architecture": "8", "CPU variant": f"0x{p.variant:x}",
                                   "CPU part": f"0x{p.part:03x}", "CPU revision": str(p.revision)}]
    hw = set(fp["cpu"]["hwcap"]) | set(fp["cpu"]["hwcap2"])
    assert set(fp["cpu"]["cpuinfo_features"]) == hw  # /proc/cpuinfo agrees with what qemu's HWCAP says
    if name == "pi":
        assert "asimddp" in hw and "sve" not in hw
    else:
        assert "asimd" in hw and "asimddp" not in hw


@pytest.mark.slow
def test_x86_avx2_guest_fingerprint():
    _need("x86-avx2")
    fp = _guest_fingerprint("x86-avx2")
    assert fp["arch"] == "x86_64"
    flags = set(fp["cpu"]["cpuinfo_flags"])
    assert {"avx2", "fma", "sse4_2"} <= flags and not {f for f in flags if f.startswith("avx512")}
    isa = set(fp["isa_flags"])  # numpy's CPUID-based dispatch view
    assert "avx2" in isa and not {f for f in isa if f.startswith("avx512")}
    assert "Haswell" in fp["cpu"]["model_name"]


@pytest.mark.slow
def test_arm_guest_compiles_modules_once_outside_the_root(monkeypatch):
    """The arm64 root ships no bytecode: the guest compiles a module once into QUANTBENCH_HOME's
    pycache (even under PYTHONDONTWRITEBYTECODE, the cache being quantbench's own), never into the root."""
    _need("pi")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    argv, env = E.python_command("pi")
    code = "import decimal; print('CACHED ' + decimal.__cached__)"
    stamps = []
    for _ in range(2):
        proc = subprocess.run(argv + ["-c", code], env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        cached = Path(next(ln for ln in proc.stdout.splitlines() if ln.startswith("CACHED "))[7:])
        assert cached.is_file() and E.pycache_dir() in cached.parents
        stamps.append(cached.stat().st_mtime_ns)
    assert stamps[0] == stamps[1]  # read back, not compiled again
    assert not (E.root_dir() / "usr" / "lib" / f"python{E.GUEST_PYTHON_VERSION}" / "__pycache__").exists()


def _classifier_fixtures(model_path: Path, count: int):
    from quantbench.inputs import sidecarfile
    from quantbench.inputs.fixtures import build_fixtures
    from quantbench.inputs.modelio import load_model
    from quantbench.inputs.preprocess import input_spec

    first = load_model(model_path).graph.input[0]
    shape = [d.dim_value or 1 for d in first.type.tensor_type.shape.dim]
    spec = input_spec(sidecarfile.load_sidecar(model_path), shape, first.name)
    return build_fixtures(spec, split="eval", limit=count)


def _static_qdq(model_path: Path, fixtures, out: Path) -> Path:
    """U8S8 MinMax static QDQ (onnxruntime's quantizer) calibrated on a few fixtures."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{fx.input_name: fx.array} for fx in fixtures])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(model_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=False)
    return out


@pytest.mark.slow
def test_local_and_arm_presets_on_the_demo_classifier(workdir):
    """fp32 is byte-identical on pi and pi4; so is static QDQ (the notes' measured equivalence).

    The same run checks the guests' identity from the fingerprints the runner stored:
    pi is part 0xd0b with asimddp, pi4 part 0xd08 without.
    """
    from quantbench.inputs import assets
    from quantbench.runs.runner import run_hosts
    from quantbench.inputs.variantdir import Variant

    model = assets.MODELS_DIR / f"{assets.DEMO_CLASSIFIER}.onnx"
    if not model.exists():
        pytest.fail(f"{model}: the bundled demo classifier is missing")
    _need("pi", "pi4")
    fxs = _classifier_fixtures(model, 6)
    assert len(fxs) == 6
    qdq = _static_qdq(model, fxs[:4], workdir / "cnn-qdq.onnx")
    variants = [Variant(name="fp32", path=model, model="litter-cnn", recipe={"variant": "fp32"}),
                Variant(name="static-qdq-u8s8", path=qdq, model="litter-cnn", recipe={"variant": "static"})]
    root = workdir / "tables"
    summary = run_hosts(["local", "pi", "pi4"], variants, fxs, progress=False, tables_root=root)
    assert not summary.errors
    out = partread.read("outputs", root, columns=["host", "variant", "fixture_id", "output_name", "sha256", "tensor",
                                                "dtype", "shape"]).to_pylist()
    by = {}
    for r in out:
        by.setdefault((r["variant"], r["fixture_id"], r["output_name"]), {})[r["host"]] = r
    n_outputs = len({r["output_name"] for r in out})
    assert len(by) == 2 * 6 * n_outputs
    for key, hosts in by.items():
        assert set(hosts) == {"local", "pi", "pi4"}, key
        assert hosts["pi"]["sha256"] == hosts["pi4"]["sha256"], key
        # The hash is over the tensor the table stores (a real result, not a placeholder).
        t = tensorcode.tensor_from_bytes(hosts["pi"]["tensor"], hosts["pi"]["dtype"], hosts["pi"]["shape"])
        assert tensorcode.tensor_sha256(t) == hosts["pi"]["sha256"]
        assert np.isfinite(t.astype(np.float64)).all()
    fps = {r["host"]: r for r in partread.read("hosts", root).to_pylist()}
    assert fps["pi"]["fingerprint_id"] != fps["pi4"]["fingerprint_id"]
    for name in ("pi", "pi4"):
        assert fps[name]["kind"] == "emulated"
        _check_arm_identity(name, json.loads(fps[name]["fingerprint"])["identity"])


@pytest.mark.slow
def test_hosts_setup_command_on_a_ready_preset_does_nothing(capsys):
    """The command path scripts/setup.sh takes (it broke once while the setup code moved)."""
    from quantbench.cli import main

    _need("pi")
    assert main(["hosts", "setup", "pi"]) == 0
    assert "nothing to do" in capsys.readouterr().out
