"""An ssh host against a real OpenSSH server started by the test on 127.0.0.1 (keys made for the test)."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hosts_helpers import fixtures, matmul_model, variant
from quantbench import tables
from quantbench.errors import UserError
from quantbench.hosts import results
from quantbench.hosts.runner import RunFailed, run_hosts
from setup_required import missing_setup

pytestmark = pytest.mark.ssh

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        missing_setup("OpenSSH server/client not installed (apt-get install openssh-server openssh-client)")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("hostkey", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "id.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text(f"""
Port {port}
ListenAddress 127.0.0.1
HostKey {d}/hostkey
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PrintMotd no
""")
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory sshd insists on
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {(d / 'hostkey.pub').read_text().split(' ', 2)[0]} "
                                   f"{(d / 'hostkey.pub').read_text().split(' ', 2)[1]}\n")
    dead = _free_port()
    (d / "ssh_config").write_text(f"""
Host qbtest
  HostName 127.0.0.1
  Port {port}
  User {os.environ.get('USER') or 'root'}
  IdentityFile {d}/id
  IdentitiesOnly yes
  UserKnownHostsFile {d}/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
Host qbdead
  HostName 127.0.0.1
  Port {dead}
  IdentityFile {d}/id
  UserKnownHostsFile {d}/known_hosts
Host qbstranger
  HostName localhost
  Port {port}
  IdentityFile {d}/id
  IdentitiesOnly yes
  UserKnownHostsFile {d}/empty_known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
""")
    (d / "empty_known_hosts").write_text("")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"sshd did not start: {proc.stderr.read().decode()}")
            time.sleep(0.1)
    hosts = d / "hosts.toml"
    opts = f'python = "{sys.executable}", ssh_options = ["-F", "{d}/ssh_config"]'
    hosts.write_text(f'robot = {{ kind = "ssh", address = "qbtest", {opts} }}\n'
                     f'dead = {{ kind = "ssh", address = "qbdead", {opts} }}\n'
                     f'stranger = {{ kind = "ssh", address = "qbstranger", {opts} }}\n')
    yield hosts
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_ssh_worker_matches_local(workdir, sshd):
    model = matmul_model(workdir / "m.onnx")
    fxs = fixtures(3)
    root = workdir / "t"
    s = run_hosts(["robot", "x86"], [variant(model)], fxs, hosts_file=sshd, progress=False, tables_root=root, jobs=2)
    assert [(h.name, h.ran, h.errors) for h in s.hosts] == [("robot", 3, []), ("x86", 3, [])]
    by = results.hashes_by_host(s.variants[0].variant_id, tables_root=root)
    assert set(by) == {"robot", "x86"} and len(by["robot"]) == 6
    assert by["robot"] == by["x86"]  # the same machine behind ssh: byte-identical outputs
    kinds = {r["host"]: r["kind"] for r in tables.read("hosts", root).to_pylist()}
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
