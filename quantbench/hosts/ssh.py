"""`ssh` hosts: a real machine reached through the user's own OpenSSH client.

`ssh` runs as a subprocess with the user's config, agent and known_hosts; host key
checking stays on and BatchMode=yes means we never prompt for or handle a password.
The remote needs only python3 with numpy and onnxruntime: a one-line bootstrap reads
the worker's source from the connection, then the worker reads its jobs (models and
input tensors travel the same way), so nothing is installed on the remote.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from quantbench.errors import UserError
from quantbench.hosts import remotetier
from quantbench.hosts.process import BOOTSTRAP, ProcessHost, worker_preamble

def remote_command(python: str = "python3", program: str = BOOTSTRAP) -> str:
    """The command line the remote shell runs: python -c BOOTSTRAP (a tier on the machine: TIER_BOOTSTRAP)."""
    return f"{shlex.quote(python)} -c {shlex.quote(program)}"


@dataclass
class SSHHost(ProcessHost):
    """Options: address (user@host or an ssh config alias), python (the remote interpreter, default python3),
    ssh_options (extra arguments for ssh, e.g. ["-F", "cfg", "-p", "2222"]: the one place for ssh options),
    ssh (the client binary). The command line ends ssh's options with `--`, so neither address nor python
    can become an option."""

    #: models and inputs travel through the connection
    model_by_path: bool = False
    #: the workers run on the remote's cores: no local slot (max_workers bounds them)
    uses_local_cores = False

    def control_path(self) -> str | None:
        """Where the shared connection's socket lives, or None when the user's options manage
        multiplexing themselves (ControlMaster / ControlPath / -S): theirs wins."""
        if self.options.get("tier"):
            # a tier's workers each open a connection of their own: sessions of masked workers multiplexed over
            # one shared master were cut mid-run ("ssh failed: no message", 1 run in 3 here), plain ones were not
            return None
        opts = " ".join(self.options.get("ssh_options", [])).lower()
        if "controlmaster" in opts or "controlpath" in opts or "-s" in self.options.get("ssh_options", []):
            return None
        d = Path(tempfile.gettempdir()) / f"quantbench-ssh-{os.getuid()}"
        try:
            d.mkdir(mode=0o700, exist_ok=True)
            if (d.stat().st_mode & 0o077) or d.stat().st_uid != os.getuid():
                return None  # not a private folder: no shared socket in it
        except OSError:
            return None
        return str(d / "%C")

    def argv(self) -> list[str]:
        """One connection per host: the first worker's ssh becomes the master (ControlMaster=auto) and
        every further worker opens a session over it, so several workers cost one handshake."""
        ssh = self.options.get("ssh") or "ssh"
        check_address(self.options.get("address", ""))
        mux = []
        cp = self.control_path()
        if cp:
            mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={cp}", "-o", "ControlPersist=10"]
        python = self.options.get("python") or "python3"
        if python.startswith("-"):
            raise UserError(f"host {self.name}: python {python!r} must name the remote interpreter, not an option")
        # `--` ends ssh's options: the destination and the remote command (one quoted word) are never parsed as
        # options, whatever they hold; ssh_options is the one place for options
        program = remotetier.TIER_BOOTSTRAP if self.options.get("tier") else BOOTSTRAP
        return [ssh, *self.options.get("ssh_options", []), *mux, "-T", "-o", "BatchMode=yes", "--",
                self.options["address"], remote_command(python, program)]

    def close_connection(self) -> None:
        """Stop the shared connection (the master) now rather than after ControlPersist."""
        cp = self.control_path()
        if not cp:
            return
        ssh = self.options.get("ssh") or "ssh"
        try:
            subprocess.run([ssh, *self.options.get("ssh_options", []), "-o", f"ControlPath={cp}", "-O", "exit", "--",
                            self.options["address"]], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            pass

    def can_fork(self) -> bool:
        """No: a forked worker connects back through a socket file on this machine."""
        return False

    def reads_input_store(self) -> bool:
        """No: the store is a file on this machine; inputs travel with each job."""
        return False

    def ready(self):
        ssh = self.options.get("ssh") or "ssh"
        if shutil.which(ssh) is None:
            return False, f"the OpenSSH client {ssh!r} is not installed (apt-get install openssh-client)"
        return True, f"ssh {self.options['address']} (connects on use; `quantbench hosts check {self.name}` tests it)"

    def command(self):
        tier = self.options.get("tier")
        return self.argv(), None, (remotetier.preamble(tier, "worker") if tier else b"") + worker_preamble()

    def setup_tier(self, timeout: float = 1800) -> list[str]:
        """Build (once) and check the masked copy of a tier on the remote (`hosts setup NAME:TIER`): what was done."""
        tier = self.options["tier"]
        try:
            r = subprocess.run(self.argv(), input=remotetier.preamble(tier, "setup"), capture_output=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise UserError(f"host {self.name}: setting up {tier} on {self.options['address']} took over "
                            f"{timeout:.0f} s") from None
        if r.returncode != 0:
            raise UserError(unreachable_message(self.name, self.options["address"], r.stderr.decode(errors="replace"))
                            if r.returncode == 255 else f"host {self.name}: "
                            + (r.stderr.decode(errors="replace").strip().splitlines() or ["setup failed"])[-1]
                            .removeprefix("quantbench: "))
        done = json.loads(r.stdout.decode().strip().splitlines()[-1])
        return [f"{self.name}: {a} (on {self.options['address']})" for a in done["done"]] or [
            f"{self.name}: the masked copy on {self.options['address']} is ready ({done['site']})"]

    def describe(self) -> str:
        tier = self.options.get("tier")
        return f"ssh {self.options['address']}" + (f", native-masked as {tier}" if tier else "")

    def died_message(self, exc) -> str:
        """The host and ssh's own last words, the same whether the connection died while the
        worker's source was being sent, with the first request, or before the first answer."""
        return unreachable_message(self.name, self.options.get("address", ""), exc.stderr)

    def job_death_message(self, exc) -> str:
        """ssh's own exit code 255 means the connection dropped, not the worker: say so with ssh's last words."""
        return self.died_message(exc) if exc.returncode == 255 else str(exc)

    def max_workers(self, fingerprint: dict) -> int:
        """The remote's cores bound its workers."""
        return max(1, int(fingerprint.get("info", {}).get("cpu_count") or 1))


def unreachable_message(host: str, address: str, stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    msg = lines[-1] if lines else "no message"
    return f"host {host}: ssh {address} failed: {msg}"


def check_address(address: str) -> None:
    if not address or address.startswith("-"):
        raise UserError(f"ssh address {address!r}: expected user@host or an ssh config alias")
