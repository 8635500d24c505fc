"""The `local` host: this machine's onnxruntime, its worker a subprocess of this interpreter
(quantbench.hosts.process has the transport)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from quantbench.hosts.process import WORKER_PATH, ProcessHost


@dataclass
class LocalHost(ProcessHost):
    """This machine's onnxruntime, in a subprocess of this interpreter (or `python` from the hosts file)."""

    local_pid_memory = True

    def command(self):
        python = self.options.get("python") or sys.executable
        env = dict(os.environ)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return [python, "-u", str(WORKER_PATH)], env, b""

    @property
    def caches_fingerprint(self) -> bool:
        """Not with its own `python`: an interpreter whose packages fpcache does not inspect."""
        return not self.options.get("python")

    def describe(self) -> str:
        return f"local ({self.options.get('python') or sys.executable})"
