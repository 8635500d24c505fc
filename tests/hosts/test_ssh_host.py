"""An ssh host against a real OpenSSH server started by the test on 127.0.0.1 (keys made for the test)."""

import pytest

from hosts_helpers import fixtures, hashes_by_host, matmul_model, variant
from quantbench.store import partread
from quantbench.errors import UserError
from quantbench.runs.runner import RunFailed, run_hosts
from ssh_helpers import ssh_machine_is_this_cpu

pytestmark = pytest.mark.ssh


def test_ssh_worker_matches_local(workdir, sshd):
    ssh_machine_is_this_cpu()
    model = matmul_model(workdir / "m.onnx")
    fxs = fixtures(3)
    root = workdir / "t"
    s = run_hosts(["robot", "x86"], [variant(model)], fxs, hosts_file=sshd, progress=False, tables_root=root, jobs=2)
    assert [(h.name, h.ran, h.errors) for h in s.hosts] == [("robot", 3, []), ("x86", 3, [])]
    by = hashes_by_host(s.variants[0].variant_id, root)
    assert set(by) == {"robot", "x86"} and len(by["robot"]) == 6
    assert by["robot"] == by["x86"]  # the same machine behind ssh: byte-identical outputs
    kinds = {r["host"]: r["kind"] for r in partread.read("hosts", root).to_pylist()}
    assert kinds == {"robot": "ssh", "x86": "local"}
    again = run_hosts(["robot"], [variant(model)], fxs, hosts_file=sshd, progress=False, tables_root=root, jobs=1)
    assert (again.hosts[0].ran, again.hosts[0].cached) == (0, 3)


@pytest.mark.parametrize("stage", ["any", "startup"])
def test_unreachable_host_names_host_and_ssh_message(workdir, sshd, monkeypatch, stage, capsys):
    """One wording whichever write or read first meets the dead connection. "startup" forces the
    earliest stage: a worker preamble larger than any pipe, so sending it must meet ssh's exit."""
    from quantbench.cli import main
    from quantbench.hosts import ssh

    if stage == "startup":
        monkeypatch.setattr(ssh, "worker_preamble", lambda: b"#" * (8 << 20))
    model = matmul_model(workdir / "m.onnx")
    for _ in range(2):
        with pytest.raises(RunFailed) as err:
            run_hosts(["dead"], [variant(model)], fixtures(1), hosts_file=sshd, progress=False,
                      tables_root=workdir / "t")
        msg = str(err.value)
        assert msg.startswith("host dead: ssh qbdead failed: ") and "Connection refused" in msg, msg
        assert main(["hosts", "--hosts-file", str(sshd), "check", "dead"]) == 2
        err_text = capsys.readouterr().err
        assert err_text.startswith("quantbench hosts: error: host dead: ssh qbdead failed: ") and \
            "Connection refused" in err_text and "Traceback" not in err_text, err_text


def test_host_key_checking_stays_on(workdir, sshd):
    model = matmul_model(workdir / "m.onnx")
    with pytest.raises(UserError, match="host stranger: ssh qbstranger failed: Host key verification failed"):
        run_hosts(["stranger"], [variant(model)], fixtures(1), hosts_file=sshd, progress=False, tables_root=workdir / "t")
