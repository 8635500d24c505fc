"""The masked copy of onnxruntime + numpy on first use (a fresh QUANTBENCH_HOME): two masked hosts of one command,
and a second command started while it is being built, all wait for one builder and then use its copy; the
build removes a copy whose source packages are gone.

One cold build (~30-60 s) serves both tests: `equiv --hosts A,B` (two tiers this CPU can show: x86-sse4 and x86-avx2
on any x86-64 with AVX2) starts on a fresh home; the build gate (fsutil.gate_mark) holds its builder after it made
its temporary folder until the command's other masked host and a second command (`hosts setup B`) are both
waiting on the lock; then it lets the build finish. Before,
the two hosts built into one `.site.tmp-<pid>` and the command died with a raw shutil.Error list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from quantbench import fsutil
from quantbench.store import partread
from quantbench.hosts import cpuidpatch as C
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts import masked as M
from cache_helpers import wait_for
from setup_required import missing_setup

pytestmark = pytest.mark.slow


def _two_tiers() -> tuple[str, str]:
    """Two masked tiers this CPU can show (x86-sse4 and x86-avx2 on any x86-64 with AVX2): a CPU that shows fewer
    skips (a fact about the CPU); a missing mechanism (no gcc, objdump; not x86-64) is missing setup."""
    shown = [n for n, p in P.PROFILES.items() if not P.missing_here(p, M.here_features())]
    if len(shown) < 2:
        if M.here_features():
            pytest.skip(f"this CPU shows {len(shown)} masked tier(s) ({', '.join(shown) or 'none'}); the race needs two")
        missing_setup(f"masked tiers: {M.masked_unavailable(P.PROFILES['x86-sse4'])}")
    pick = ("x86-avx2", "x86-sse4") if {"x86-avx2", "x86-sse4"} <= set(shown) else tuple(shown[:2])
    for name in pick:
        why = M.masked_unavailable(P.PROFILES[name])
        if why:
            missing_setup(f"masked {name}: {why}")
    return pick


@pytest.fixture(scope="module")
def cold_start(tmp_path_factory):
    tiers = _two_tiers()
    base = tmp_path_factory.mktemp("masked-cold")
    home, gate, work = base / "home", base / "gate", base / "work"
    for d in (gate, work):
        d.mkdir()
    env = dict(os.environ, QUANTBENCH_HOME=str(home), **{fsutil.BUILD_GATE: str(gate)})
    orphan = home / "masked" / "1.0.0-0123456789abcdef"   # a copy whose venv was deleted: the build removes it
    (orphan / "site").mkdir(parents=True)
    orphan.with_name(orphan.name + ".json").write_text(json.dumps(
        {"key": "0123456789abcdef", "sources": [str(base / "deleted-venv" / "onnxruntime")], "files": {}}))
    (gate / f"go.{C.shim_path().name}").touch()  # the shim is not held: the copy ("site") is the entry raced on
    qb = [sys.executable, "-m", "quantbench"]
    subprocess.run(qb + ["calibrate", "--no-progress"], cwd=work, env=env, check=True, capture_output=True)
    equiv = subprocess.Popen(qb + ["equiv", "--hosts", ",".join(tiers), "--limit", "2", "--no-progress", "--no-plots"],
                             cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(gate, "building.site.*", 1, [equiv])
    setup = subprocess.Popen(qb + ["hosts", "setup", tiers[1], "--no-progress"], cwd=work, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(gate, "waiting.site.*", 2, [equiv, setup])  # the command's other host and the second command
    (gate / "go.site").touch()
    results = {}
    for name, p in (("equiv", equiv), ("setup", setup)):
        out, err = p.communicate(timeout=900)
        results[name] = (p.returncode, out, err)
    return {"home": home, "gate": gate, "work": work, "tiers": tiers, "orphan": orphan, **results}


def test_two_masked_hosts_of_one_command_on_a_cold_cache_share_one_build(cold_start):
    rc, out, err = cold_start["equiv"]
    assert rc in (0, 1), err[-3000:]  # exit 1: a gate failed (tiers may differ); never a crash (2)
    assert not any(w in err for w in ("Traceback", "shutil.Error", "FileExistsError")), err[-3000:]
    hosts = partread.read("outputs", root=cold_start["work"] / "results" / "tables", columns=["host"])
    per_host = Counter(hosts.column("host").to_pylist())
    assert sorted(per_host) == sorted(cold_start["tiers"]) and len(set(per_host.values())) == 1, out[-3000:]  # both ran it all
    building = list(cold_start["gate"].glob("building.site.*"))
    owners = {p.name.split(".")[2] for p in cold_start["gate"].glob("waiting.site.*")}
    assert len(building) == 1 and building[0].name.split(".")[2] in owners  # the command's own second host waited


def test_a_second_command_on_a_cold_cache_waits_then_uses_the_copy(cold_start):
    rc, out, err = cold_start["setup"]
    assert rc == 0 and out.strip().splitlines()[-1] == "nothing to do: already set up", (out, err)
    masked = cold_start["home"] / "masked"
    copies = [d for d in masked.iterdir() if d.is_dir()]
    assert len(copies) == 1 and sorted(p.name for p in copies[0].iterdir()) == [".site.lock", "cpuid-sites.tsv",
                                                                               "site"]  # no temporary left
    assert (masked / f"{copies[0].name}.json").is_file()  # its stamp, written once the copy was in place
    orphan = cold_start["orphan"]   # the copy of a deleted venv: removed by the build, stamp and all
    assert not orphan.exists() and not orphan.with_name(orphan.name + ".json").exists()
    assert not fsutil.stale_tmp(copies[0]) and not [p for p in masked.iterdir() if p.name.endswith(".tmp")]
