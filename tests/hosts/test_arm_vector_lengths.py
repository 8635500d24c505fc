"""ARM vector lengths are part of a host: the presets pin them, a hosts file may set them (checked against what the
qemu model can run), and the fingerprint reads them inside the guest (prctl), where the preset's claim is checked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from quantbench.errors import UserError
from quantbench.hosts import emulated as E
from quantbench import worker as W
from quantbench.hosts.registry import hosts_from_text, make_host
from setup_required import missing_setup

WORKER_ENTRY = Path(W.jobs.__file__).resolve()   # run in the guest with its sibling sources
NEW_ARM = ("graviton4", "orin", "phone-sme2", "docker-arm64")


def test_presets_pin_the_vector_lengths_of_the_device_they_stand_for():
    want = {"graviton3": (256, 0, "neoverse-v1"), "graviton4": (128, 0, "neoverse-n2"), "orin": (0, 0, "cortex-a76"),
            "phone-sme2": (128, 512, "max,sve-default-vector-length=16,sme-default-vector-length=64"),
            "docker-arm64": (512, 256, "max"), "pi": (0, 0, "cortex-a76")}
    for name, (sve, sme, cpu) in want.items():
        p = E.PRESETS[name]
        assert (p.sve_bits, p.sme_bits, p.cpu_option) == (sve, sme, cpu), name
    # every length but docker-arm64's is one a shipping core has: never qemu's 512-bit default
    assert [n for n, p in E.PRESETS.items() if p.sve_bits >= 512] == ["docker-arm64"]
    assert E.PRESETS["orin"].intra_op_threads == 6 and "Orin Nano" in E.PRESETS["orin"].device
    assert "no shipping device" in E.PRESETS["docker-arm64"].device
    for name in NEW_ARM:
        assert E.PRESETS[name].device and E.PRESETS[name].description


def _hosts(tmp_path: Path, line: str) -> dict:
    path = tmp_path / "hosts.toml"
    text = f"[hosts]\n{line}\n"
    path.write_text(text)
    return hosts_from_text(path, text, tmp_path)


@pytest.mark.parametrize("line, problem", [
    ('m = { kind = "emulated", preset = "phone-sme2", sve_vector_bits = 100 }',
     r"sve_vector_bits = 100: preset phone-sme2 \(qemu -cpu max\) runs SVE at 128, 256, 512, 1024 or 2048 bits$"),
    ('m = { kind = "emulated", preset = "phone-sme2", sme_vector_bits = 4096 }', r"sme_vector_bits = 4096: .* SME at"),
    ('m = { kind = "emulated", preset = "pi", sve_vector_bits = 128 }',
     r"sve_vector_bits = 128: preset pi \(qemu -cpu cortex-a76\) has no SVE$"),
    ('m = { kind = "emulated", preset = "graviton4", sve_vector_bits = 256 }', r"runs SVE at 128 bits only$"),
    ('m = { kind = "emulated", preset = "graviton3", sme_vector_bits = 512 }', r"has no SME$"),
    ('m = { kind = "emulated", preset = "docker-arm64", sve_vector_bits = "512" }', r"sve_vector_bits = '512'"),
])
def test_a_hosts_file_with_an_impossible_vector_length_is_one_line_naming_it(tmp_path, line, problem):
    with pytest.raises(UserError) as err:
        _hosts(tmp_path, line)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'hosts.toml'}:2: host 'm': ")
    assert __import__("re").search(problem, msg), msg


def test_a_hosts_file_sets_the_vector_lengths_the_guest_runs_with(tmp_path):
    spec = _hosts(tmp_path, 'm = { kind = "emulated", preset = "docker-arm64", sve_vector_bits = 256, '
                            'sme_vector_bits = 512 }')["m"]
    host = make_host(spec)
    assert host.cpu == "max,sve-default-vector-length=32,sme-default-vector-length=64"
    assert host.vector_bits == {"sve_vector_bits": 256, "sme_vector_bits": 512}
    assert make_host(_hosts(tmp_path, 'v = { kind = "emulated", preset = "graviton3", sve_vector_bits = 128 }')["v"]
                     ).cpu == "neoverse-v1,sve-default-vector-length=16"


def _fp(isa, sve, sme) -> dict:
    return {"identity": {"arch": "aarch64", "isa_flags": isa, "sve_vector_bits": sve, "sme_vector_bits": sme}}


def test_a_guest_that_is_not_the_presets_cpu_is_refused():
    host = E.EmulatedHost(name="phone-sme2", kind="emulated", options={})
    isa = list(E.PRESETS["phone-sme2"].expect_features)
    assert host.fingerprint_problem(_fp(isa, 128, 512)) is None
    assert "vector lengths are SVE 512 and SME 256 bits, not 128 and 512" in host.fingerprint_problem(_fp(isa, 512, 256))
    assert "it lacks sme" in host.fingerprint_problem(_fp([f for f in isa if f != "sme"], 128, 512))
    pi = E.EmulatedHost(name="pi", kind="emulated", options={})
    assert pi.fingerprint_problem(_fp(["asimd", "asimddp"], 0, 0)) is None
    assert "it has sve" in pi.fingerprint_problem(_fp(["asimd", "asimddp", "sve"], 128, 0))


def test_an_x86_fingerprint_carries_no_vector_lengths():
    """They are aarch64 fields: x86 fingerprints (and their ids) stay as they were."""
    assert W.arm_vector_lengths("x86_64") == {}
    assert W.arm_vector_lengths("aarch64").keys() == {"sve_vector_bits", "sme_vector_bits"}


# --------------------------------------------------------------------------- slow: real qemu


def _guest_identity(host) -> dict:
    argv, env = E.python_command(host.preset, cpu=host.cpu)
    code = ("import json, runpy; worker = runpy.run_path(%r, init_globals={'_SOURCES': None}); "
            "print('FP ' + json.dumps(worker['collect_fingerprint']()))" % str(WORKER_ENTRY))
    proc = subprocess.run(argv + ["-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("FP "))[3:])


@pytest.mark.slow
def test_the_fingerprint_reads_the_vector_lengths_inside_the_guest(tmp_path):
    """prctl in the guest, not the preset's word: phone-sme2's pinned lengths, and a hosts file's own on
    docker-arm64 (qemu's max told 256-bit SVE and 512-bit SME)."""
    for name in ("phone-sme2", "docker-arm64"):
        ok, msg = E.ready(name)
        if not ok:
            missing_setup(f"{name} not set up: {msg}")
    phone = E.EmulatedHost(name="phone-sme2", kind="emulated", options={})
    fp = _guest_identity(phone)
    assert (fp["identity"]["sve_vector_bits"], fp["identity"]["sme_vector_bits"]) == (128, 512)
    assert phone.fingerprint_problem(fp) is None
    mine = make_host(_hosts(tmp_path, 'd = { kind = "emulated", preset = "docker-arm64", sve_vector_bits = 256, '
                                      'sme_vector_bits = 512 }')["d"])
    fp = _guest_identity(mine)
    assert (fp["identity"]["sve_vector_bits"], fp["identity"]["sme_vector_bits"]) == (256, 512)
    assert mine.fingerprint_problem(fp) is None
    assert E.EmulatedHost(name="docker-arm64", kind="emulated", options={}).fingerprint_problem(fp)
