"""A real OpenSSH server on 127.0.0.1 for the ssh-host tests (keys made for the test): the `sshd` fixture.

A test asks for it by name (tests/conftest.py registers this module as a plugin); it yields a hosts file naming
`robot` (reachable), `dead` (nothing listening) and `stranger` (host key not known). The server accepts the worker's
test-only pause variables (QUANTBENCH_TEST_PAUSE_*, quantbench.worker) from a client that sends them
(`-o SendEnv=QUANTBENCH_TEST_PAUSE_*`), so a test can pause a remote worker as it pauses a local one.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from setup_required import missing_setup

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
AcceptEnv QUANTBENCH_TEST_PAUSE_AFTER QUANTBENCH_TEST_PAUSE_FILE
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


def ssh_machine_is_this_cpu() -> None:
    """The ssh machine of these tests is this one: its workers see this CPU as it is. Under a whole-process CPUID
    mask (`quantbench hosts exec TIER`) the local workers see the tier instead, so a test comparing the two
    CPUs is skipped: a fact of the run, not missing setup."""
    from quantbench.worker import cpuid_function

    if cpuid_function()[1] == "masked":
        pytest.skip("this process runs under a CPUID mask: the ssh machine (this one, unmasked) is another CPU")
