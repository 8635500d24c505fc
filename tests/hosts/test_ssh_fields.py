"""Each ssh hosts-file field does only what its name says: `python` names the remote interpreter and
`address` the destination; neither can become an ssh option (only `ssh_options` holds options)."""

import os
import stat
import sys

import pytest

from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.hosts.registry import HostSpec, make_host

pytestmark = pytest.mark.ssh


def _evil(tmp_path):
    """A program that leaves a marker file if anything runs it."""
    marker = tmp_path / "evil-ran"
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    evil.chmod(evil.stat().st_mode | stat.S_IXUSR)
    return evil, marker


def _hosts_file(tmp_path, sshd, **fields):
    cfg = sshd.parent / "ssh_config"
    body = ", ".join(f'{k} = "{v}"' for k, v in fields.items())
    path = tmp_path / "quantbench.toml"
    path.write_text(f'h = {{ kind = "ssh", {body}, ssh_options = ["-F", "{cfg}"] }}\n')
    return path


@pytest.mark.parametrize("field", ["python", "address"])
def test_option_shaped_field_is_refused_and_runs_nothing(workdir, sshd, capsys, field):  # noqa: F811
    evil, marker = _evil(workdir)
    fields = {"address": "qbtest", "python": "python3"}
    fields[field] = f"-oProxyCommand={evil}"
    hosts = _hosts_file(workdir, sshd, **fields)
    before = sorted(os.listdir(workdir))
    assert main(["hosts", "--hosts-file", str(hosts), "check", "h"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"quantbench hosts: error: {hosts}:1: host 'h': {field} '-oProxyCommand="), err
    assert "must not start with '-'" in err and "ssh_options" in err, err
    assert not marker.exists(), "evil.sh ran"
    assert sorted(os.listdir(workdir)) == before  # nothing written


def test_library_host_refuses_option_shaped_python(workdir, sshd):  # noqa: F811
    """A host built without the hosts file (a library caller) refuses it too, before starting ssh."""
    evil, marker = _evil(workdir)
    host = make_host(HostSpec("h", "ssh", {"address": "qbtest", "python": f"-oProxyCommand={evil}",
                                           "ssh_options": ["-F", str(sshd.parent / "ssh_config")]}))
    with pytest.raises(UserError, match=r"^host h: python '-oProxyCommand=.*' must name the remote interpreter"):
        host.argv()
    assert not marker.exists()


def test_destination_and_command_follow_end_of_options(workdir, sshd, capsys):  # noqa: F811
    """ssh's options end with `--`; the destination and the remote command (one word) follow, and the
    real OpenSSH client and server accept that form."""
    host = make_host(HostSpec("robot", "ssh", {"address": "qbtest", "python": sys.executable,
                                               "ssh_options": ["-F", str(sshd.parent / "ssh_config")]}))
    argv = host.argv()
    assert argv[-3:-1] == ["--", "qbtest"] and argv[-1].startswith(f"{sys.executable} -c ")
    assert main(["hosts", "--hosts-file", str(sshd), "check", "robot"]) == 0, capsys.readouterr().err
