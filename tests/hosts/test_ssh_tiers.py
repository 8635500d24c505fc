"""An x86 tier on an ssh machine (`NAME:TIER`, or `tier = ...` in its hosts-file entry: quantbench.hosts.remotetier):
the remote builds and checks its own masked copy (`hosts setup`), its worker runs masked there, and its outputs are
byte-identical to the local masked tier of the same name; here the ssh machine is this one (the suite's real sshd on
127.0.0.1), so its tiers are this CPU's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from quantbench.cli import main
from quantbench.inputs.assets import demo_model
from quantbench.errors import UserError
from quantbench.hosts import cpuprofiles as P
from quantbench.hosts import masked as M
from quantbench.hosts.registry import resolve_hosts
from quantbench.hosts.workerclient import WorkerClient
from setup_required import need_tier
from ssh_helpers import ssh_machine_is_this_cpu
from tier_helpers import random_fixtures, real_tier_inputs

pytestmark = pytest.mark.ssh
TIER = "x86-sse4"


def _hashes(name: str, hosts_file, models: dict, fixtures) -> tuple[dict, dict]:
    spec = resolve_hosts([name], hosts_file)[0]
    out = {}
    with WorkerClient(spec) as hs:
        for variant, path in models.items():
            rows = hs.run(Path(path).read_bytes(), fixtures)
            out[variant] = [o["sha256"] for r in rows for o in r["outputs"].values()]
        return out, hs.frame["fingerprint"]


@pytest.fixture(scope="module")
def demo(demo_tiers):
    return dict(demo_tiers)


def test_hosts_setup_builds_the_tier_on_the_machine(sshd, capsys):
    need_tier(TIER)
    assert main(["hosts", "--hosts-file", str(sshd), "setup", f"robot:{TIER}", "--no-progress"]) == 0
    out = capsys.readouterr().out
    # "...: built ... (on qbtest)" when the remote built its copy now, "... the masked copy on qbtest is ready" when it had one
    assert out.startswith(f"robot:{TIER}: ") and "on qbtest" in out and "set up in" in out


@pytest.mark.parametrize("tier", [TIER, "x86-avx2"])
def test_a_tier_on_an_ssh_machine_gives_the_local_masked_bytes(sshd, demo, tier):
    need_tier(tier)
    fixtures = random_fixtures(demo_model(), 2)
    remote, rfp = _hashes(f"robot:{tier}", sshd, demo, fixtures)
    local, lfp = _hashes(f"{tier}:masked", None, demo, fixtures)
    assert remote == local and set(remote) == {"fp32", "dynamic", "static"} and all(remote.values())
    assert rfp["identity"]["cpu_mechanism"] == "native-masked" == lfp["identity"]["cpu_mechanism"]
    assert rfp["identity"]["isa_flags"] == lfp["identity"]["isa_flags"]


@pytest.mark.slow
def test_a_tier_on_an_ssh_machine_on_a_real_model(sshd, tmp_path):
    need_tier(TIER)
    models, fixtures = real_tier_inputs(tmp_path)
    assert _hashes(f"robot:{TIER}", sshd, models, fixtures)[0] == _hashes(f"{TIER}:masked", None, models, fixtures)[0]


def test_equiv_over_local_and_remote_tiers_finds_one_class(sshd, workdir, capsys):
    need_tier(TIER)
    (workdir / "hosts.toml").write_text(sshd.read_text() + f'spr-sse4 = {{ kind = "ssh", address = "qbtest", '
                                        f'python = {json.dumps(sys.executable)}, ssh_options = {_ssh_options(sshd)}, '
                                        f'tier = "{TIER}" }}\n')
    assert main(["calibrate", "--no-progress"]) == 0
    code = main(["equiv", "--hosts", f"{TIER}:masked,robot:{TIER},spr-sse4", "--hosts-file", "hosts.toml",
                 "--limit", "2", "--no-progress", "--no-plots", "--gate", "classes"])
    err = capsys.readouterr().err
    assert code == 0, err
    report = json.loads((workdir / "results" / "equiv.json").read_text())
    assert code == 0 and all(len(v["classes"]) == 1 for v in report["variants"])
    assert report["hosts"][f"robot:{TIER}"]["cpu_mechanism"] == "native-masked"


def test_a_tier_the_machine_cannot_show_is_one_line(sshd):
    ssh_machine_is_this_cpu()   # which tiers the ssh machine lacks: this CPU's, unmasked
    lacking = [t for t, p in P.PROFILES.items() if P.missing_here(p, M.here_features())]
    if not lacking:
        pytest.skip("this CPU shows every x86 tier")
    need_tier(TIER)
    with pytest.raises(UserError) as exc:
        WorkerClient(resolve_hosts([f"robot:{lacking[0]}"], sshd)[0]).open()
    msg = str(exc.value)
    assert "\n" not in msg and f"{lacking[0]} on this machine" in msg and "this CPU lacks" in msg, msg


def test_a_tier_needs_an_ssh_machine_and_a_known_name(sshd):
    with pytest.raises(UserError, match=r"a tier after a host's name needs an ssh host .* x86 is local"):
        resolve_hosts(["x86:x86-avx2"])
    with pytest.raises(UserError, match=r"'x86-nosuch' is neither a mechanism"):
        resolve_hosts(["robot:x86-nosuch"], sshd)


def _ssh_options(hosts_file) -> str:
    line = next(ln for ln in Path(hosts_file).read_text().splitlines() if ln.startswith("robot"))
    return line.split("ssh_options = ", 1)[1].rstrip(" }")
