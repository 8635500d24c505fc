"""`--hosts`: one grammar (NAME or NAME+KEY=VALUE), one parser for every command; each host kind owns its policies."""

import pytest

from hosts_helpers import matmul_model
from quantbench.errors import UserError
from quantbench.hosts.registry import HostSpec, make_host, parse_hosts


def _error(capsys, argv) -> str:
    """The one-line error of a refused command, without its `quantbench CMD: error: ` prefix."""
    from quantbench.cli import main

    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0].split(": error: ", 1)[1]


@pytest.mark.parametrize("item, says", [
    ("x86+oops", "--hosts 'x86+oops': override 'oops' must be KEY=VALUE"),
    ("x86+=1", "--hosts 'x86+=1': override '=1' must be KEY=VALUE"),
    ("nosuchhost", "--hosts: unknown host 'nosuchhost'; known hosts:"),
    ("nosuchhost+session.x=1", "--hosts: unknown host 'nosuchhost'; known hosts:"),
    (" , ", "--hosts: no host named; e.g. --hosts x86,pi"),
])
def test_one_grammar_for_every_command(workdir, capsys, item, says):
    """The same bad item reads the same from run, equiv, the explain commands and `hosts check`."""
    model = str(matmul_model(workdir / "m.onnx"))
    commands = [["run", "--hosts", item, "--variants", model],
                ["equiv", "--hosts", item, "--variants", model],
                ["localize", "--hosts", item, "--variant", model],
                ["noise", "--hosts", item, "--variant", model],
                ["remedy", "--hosts", item, "--variant", model],
                ["latency", "--hosts", item, "--variants", model]]
    errors = {argv[0]: _error(capsys, argv) for argv in commands}
    assert set(errors.values()) == {errors["run"]}, errors
    assert errors["run"].startswith(says), errors["run"]
    check = _error(capsys, ["hosts", "check", item])  # the same words, under its own option name
    assert check == errors["run"].replace("--hosts", "hosts check"), check
    assert not (workdir / "results").exists()  # refused before anything was written


def test_run_and_equiv_refuse_session_overrides(workdir, capsys):
    """run and equiv run every host under one session: a well-formed override is refused, saying where it works."""
    model = str(matmul_model(workdir / "m.onnx"))
    item = "x86+session.x64quantprecision=1"
    for argv in (["run", "--hosts", f"x86,{item}", "--variants", model],
                 ["equiv", "--hosts", f"x86,{item}", "--variants", model]):
        msg = _error(capsys, argv)
        assert msg.startswith(f"--hosts '{item}': per-host session overrides (NAME+KEY=VALUE) are taken by "
                              "localize, noise, remedy, latency and hosts check"), msg
        assert "--session-config" in msg
    assert not (workdir / "results").exists()
    # the same item is a host request where overrides are taken
    [plain, ov] = parse_hosts(f"x86,{item}")
    assert (plain.label, ov.label) == ("x86", item)
    assert ov.session["config_entries"] == {"session.x64quantprecision": "1"} and plain.session["config_entries"] == {}


def test_parse_hosts_items():
    base = {"graph_optimization_level": "basic", "config_entries": {"session.disable_prepacking": "1"}}
    reqs = parse_hosts(" x86 , pi + intra_op_num_threads = 2 + session.qdqisint8allowed=0 ,x86, "
                       "x86+session.disable_prepacking=1", base)
    # identical requests count once (x86+session.disable_prepacking=1 is x86 under the base session)
    assert [r.label for r in reqs] == ["x86", "pi + intra_op_num_threads = 2 + session.qdqisint8allowed=0"]
    x86, pi = reqs
    assert x86.spec.name == "x86" and pi.spec.kind == "emulated"
    assert x86.session["graph_optimization_level"] == "basic" and x86.session["intra_op_num_threads"] == 1
    assert pi.session["intra_op_num_threads"] == 2
    assert pi.session["config_entries"] == {"session.disable_prepacking": "1", "session.qdqisint8allowed": "0"}
    assert base["config_entries"] == {"session.disable_prepacking": "1"}  # the caller's session is not changed
    assert [r.spec.name for r in parse_hosts("x86,pi", overrides=False)] == ["x86", "pi"]
    with pytest.raises(UserError, match="session options: "):
        parse_hosts("x86+intra_op_num_threads=many")


def test_hosts_check_takes_an_override(workdir, capsys):
    from quantbench.cli import main

    assert main(["hosts", "check", "x86+session.x64quantprecision=1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("host ") and "x86+session.x64quantprecision=1 (local" in out.splitlines()[0]
    assert '"session.x64quantprecision": "1"' in out
    assert _error(capsys, ["hosts", "check", "x86,pi"]) == "hosts check 'x86,pi': name one host (it checks one at a time)"


def test_each_kind_owns_its_policies(workdir):
    """Start-up transport, slots, worker bound, dead-worker wording and version policy come from the host class."""
    from quantbench.hosts.process import WorkerDied

    local = make_host(HostSpec("x86", "local"))
    emu = make_host(HostSpec("pi", "emulated", {"preset": "pi"}))
    ssh = make_host(HostSpec("robot", "ssh", {"address": "pi@robot.local"}))
    imp = make_host(HostSpec("air", "imported", {"file": "x.qbr"}))
    assert [type(h).__name__ for h in (local, emu, ssh, imp)] == ["LocalHost", "EmulatedHost", "SSHHost", "ImportedHost"]
    assert [h.kind for h in (local, emu, ssh, imp)] == ["local", "emulated", "ssh", "imported"]
    assert [h.model_by_path for h in (local, emu, ssh)] == [True, False, False]
    assert [h.uses_local_cores for h in (local, emu, ssh)] == [True, True, False]
    assert [h.runs_workers for h in (local, emu, ssh, imp)] == [True, True, True, False]
    fp = {"info": {"cpu_count": 4}}
    assert ssh.max_workers(fp) == 4 and ssh.max_workers({"info": {}}) == 1 and local.max_workers(fp) > 1000
    # a mid-job death: ssh's own exit code 255 is the connection, any other code is the worker
    dropped = WorkerDied("worker exited with code 255 before finishing", 255,
                         "ssh: connect to host robot.local port 22: Connection refused")
    crashed = WorkerDied("worker was killed by signal 9 before finishing", -9, "")
    assert ssh.job_death_message(dropped) == ("host robot: ssh pi@robot.local failed: "
                                              "ssh: connect to host robot.local port 22: Connection refused")
    assert ssh.job_death_message(crashed) == str(crashed) and local.job_death_message(dropped) == str(dropped)
    # onnxruntime versions: an ssh host notes a difference; a local or emulated host runs the version of its
    # runtime (the local one, or NAME@VERSION), and only a worker importing another one (a stale setup) is refused
    from quantbench.hosts.keys import local_ort_version

    here = local_ort_version()
    assert local.version_policy(here, here) is None and emu.version_policy(here, "1.0.0") is None
    assert ssh.version_policy("1.19.2", "1.20.0") == ("host robot runs onnxruntime 1.19.2 (local: 1.20.0); "
                                                    "differences may come from the version")
    with pytest.raises(UserError, match=rf"host pi: its worker imported onnxruntime 1\.19\.2, not the {here} of"):
        emu.version_policy("1.19.2", here)
    pinned = make_host(HostSpec("pi4@1.20.1", "emulated", {"preset": "pi4", "onnxruntime": "1.20.1"}))
    assert pinned.version_policy("1.20.1", here) is None
    with pytest.raises(UserError, match="unknown kind 'ftp'"):
        make_host(HostSpec("x", "ftp"))


def test_run_hosts_names_a_host_once(workdir):
    """A host named twice (by name or spec) runs once, not twice over the same keys."""
    from hosts_helpers import fixtures, variant
    from quantbench.hosts.registry import resolve_hosts
    from quantbench.runs.runner import run_hosts

    model = matmul_model(workdir / "m.onnx")
    s = run_hosts(["x86", "x86", resolve_hosts(["x86"])[0]], [variant(model)], fixtures(1), progress=False,
                  tables_root=workdir / "t", jobs=1)
    assert [(h.name, h.ran) for h in s.hosts] == [("x86", 1)]
