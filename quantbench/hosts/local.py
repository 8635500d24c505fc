"""The `local` host: this machine's onnxruntime, its worker a subprocess of this interpreter
(quantbench.hosts.process has the transport). A local host may carry another runtime
(quantbench.hosts.runtimes): another pip onnxruntime version, first on this interpreter's path,
or a Debian root's python3 with its onnxruntime, started with the root's own loader."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass

from quantbench.hosts import runtimes
from quantbench.hosts.process import WORKER_PATH, ProcessHost, without_process_mask


@dataclass
class LocalHost(ProcessHost):
    """This machine's onnxruntime, in a subprocess of this interpreter (or `python` from the hosts file)."""

    local_pid_memory = True

    @property
    def runtime(self) -> runtimes.Runtime:
        return runtimes.runtime_of(self.options, "pypi", f"host {self.name}")

    def _site(self):
        """The site folder of another pip onnxruntime version (None: this interpreter's own)."""
        rt = self.runtime
        if rt.debian or not rt.version:
            return None
        return runtimes.site_dir(rt.version, platform.machine(), runtimes.local_python_version())

    def ready(self):
        rt, fix = self.runtime, f"run `quantbench hosts setup {self.name}`"
        if rt.debian:
            ok, msg = runtimes.debian_ready(rt.suite, platform.machine())
            return (True, msg) if ok else (False, f"{msg}; {fix}")
        site = self._site()
        if site is not None and runtimes.read_stamp(site) is None:
            return False, f"onnxruntime {rt.version} for this Python is missing ({site}); {fix}"
        return True, "ready"

    def command(self):
        rt = self.runtime
        # this interpreter's own onnxruntime keeps a whole-process mask (hosts exec); any other has no masked copy
        own = not (rt.debian or rt.version or self.options.get("python"))
        env = dict(os.environ) if own else without_process_mask(dict(os.environ))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if rt.debian:
            argv, changes = runtimes.native_debian_command(rt.suite)
            for key in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV"):
                env.pop(key, None)
            env.update(changes)
            return argv + ["-u", str(WORKER_PATH)], env, b""
        site = self._site()
        if site is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [env.get("PYTHONPATH", "")] if p])
        python = self.options.get("python") or sys.executable
        return [python, "-u", str(WORKER_PATH)], env, b""

    @property
    def caches_fingerprint(self) -> bool:
        """Not with its own `python`: an interpreter whose packages fingerprintcache does not inspect."""
        return not self.options.get("python")

    def fingerprint_cache_parts(self, env: dict) -> dict:
        """The runtime's stamp (a site folder or Debian root set up again changes the key); nothing for this
        interpreter's own onnxruntime (the common parts cover it)."""
        rt = self.runtime
        if not (rt.debian or rt.version):
            return {}
        folder = runtimes.debian_root(rt.suite, platform.machine()) if rt.debian else self._site()
        return {"runtime": rt.tag, "stamp": runtimes.read_stamp(folder) if folder is not None else None}

    def version_policy(self, remote: str, local: str) -> str | None:
        """Its own version is a fingerprint field; a worker importing another one than set up is an error."""
        if self.options.get("python"):
            return super().version_policy(remote, local)
        return runtimes.version_check(self.name, self.runtime, remote)

    def can_fork(self) -> bool:
        """Not with a Debian runtime: its worker holds a second thread once onnxruntime is loaded, and a child
        forked from it hung in a futex wait (measured on x86-dnnl): each worker starts anew instead."""
        return not self.runtime.debian and super().can_fork()

    def start_failure(self, exc) -> str | None:
        return runtimes.start_failure(self.runtime, platform.processor() or platform.machine(), exc)

    def describe(self) -> str:
        rt = self.runtime
        if rt.debian or rt.version:
            return f"local ({rt.describe()})"
        return f"local ({self.options.get('python') or sys.executable})"
