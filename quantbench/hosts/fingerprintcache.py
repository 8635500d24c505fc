"""A host's fingerprint, cached under a key made of everything that can change it.

Fingerprinting a host means starting its worker (for an emulated host, seconds of
qemu start-up) and asking it. A rerun whose results are all in the tables needs
the fingerprint only to find them, so the runner looks it up here first and
starts no worker when every result is cached (a run with work left still starts
a worker, fingerprints it for real and refreshes the entry).

The key is a SHA-256 over what determines the fingerprint's identity:
  - the host kind, its options and (emulated) its preset;
  - the worker's source (it is the code that collects the fingerprint);
  - the session options and the fallback setting;
  - the worker command line and the environment variables that reach the
    interpreter, onnxruntime, numpy's BLAS or qemu;
  - size and mtime of every file on the command line (qemu binary, guest
    Python, this interpreter, the worker);
  - emulated: the preset prefix's proc/cpuinfo and stamp, the arm64 root's and
    the wheel set's stamps (what `hosts setup` installed);
  - the local onnxruntime and numpy installs (x86 presets run this interpreter
    under qemu, local hosts run it natively);
  - the local CPU identity (/proc/cpuinfo fields the worker reads, AT_HWCAP),
    the C library and the kernel release.
Hosts whose numerics can change without any of these changing are never cached:
ssh hosts (the remote machine), and local hosts with their own `python` (an
interpreter whose packages we do not inspect). Each host class says which it is
(`caches_fingerprint`) and adds its kind's own material (`fingerprint_cache_parts`:
the emulated preset's files). QUANTBENCH_FINGERPRINT_CACHE=0 turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

from quantbench.inputs.assets import quantbench_home
from quantbench.fsutil import atomic_write_text, cache_on, canonical_json, content_key
from quantbench import worker
from quantbench.hosts.process import worker_code_sha256

VERSION = 2  # 2: the key says require_providers (was allow_fallback, inverted); the worker's code: process.worker_code_sha256
_ENV_PREFIXES = ("PYTHON", "QEMU", "LD_", "OPENBLAS", "OMP_", "ORT_", "MKL", "GOMP", "KMP_", "NPY_", "NUMPY",
                 "QUANTBENCH_CPUID", "GLIBC_TUNABLES")  # the last two: a CPUID mask (masked hosts, hosts exec)


def enabled() -> bool:
    return cache_on("QUANTBENCH_FINGERPRINT_CACHE")


def cache_dir() -> Path:
    return quantbench_home() / "fingerprints"


def _stat(path) -> list:
    try:
        p = Path(path)
        st = p.stat()
        return [str(p.resolve()), st.st_size, st.st_mtime_ns]
    except (OSError, ValueError):
        return [str(path), None, None]


def _package_stats(name: str) -> list:
    """Size/mtime of a package's entry files and compiled modules (a reinstall or upgrade changes them)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return [name, None]
    if spec is None or not spec.submodule_search_locations:
        return [name, None]
    root = Path(list(spec.submodule_search_locations)[0])
    files = [root / "__init__.py", root / "version.py"]
    for sub in ("capi", "_core", "core"):
        d = root / sub
        if d.is_dir():
            files += sorted(d.glob("*.so")) + sorted(d.glob("build_and_package_info.py"))
    return [name, [_stat(f) for f in files if f.exists()]]


def _local_cpu() -> dict:
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        libc = ""
    return {"cpuinfo": worker.read_cpuinfo(), "auxv": worker.read_auxv(), "machine": platform.machine(),
            "libc": libc, "kernel": platform.release()}


def cache_key(host, session: dict, require_providers: bool) -> str | None:
    """The key of `host`'s fingerprint (a ProcessHost), or None when it must always be asked.

    The host says whether its kind can be cached and adds its kind's own key material
    (ProcessHost.caches_fingerprint / fingerprint_cache_parts); the rest is common to every kind.
    """
    if not enabled() or not host.caches_fingerprint:
        return None
    try:
        argv, env, preamble = host.command()
    except Exception:
        return None
    env = env if env is not None else dict(os.environ)
    parts = _common_parts(host, session, require_providers, argv, env, preamble)
    parts.update(host.fingerprint_cache_parts(env))
    return content_key(parts)


def _common_parts(host, session: dict, require_providers: bool, argv, env: dict, preamble) -> dict:
    """The key material every cacheable kind shares: identity, worker, session, command line, this machine."""
    return {
        "version": VERSION,
        "kind": host.kind,
        "name": host.name,
        "options": canonical_json(host.options),
        "worker": worker_code_sha256(),
        "session": session,
        "require_providers": bool(require_providers),
        "argv": list(argv),
        "preamble": hashlib.sha256(preamble or b"").hexdigest(),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(_ENV_PREFIXES)},
        "files": [_stat(a) for a in argv if os.path.sep in a and os.path.exists(a)],
        "local_cpu": _local_cpu(),
        "local_python": [sys.version, _stat(sys.executable)],
        "packages": [_package_stats("onnxruntime"), _package_stats("numpy")],
    }


def remembered(host, session: dict, require_providers: bool) -> tuple[dict, str] | None:
    """`host`'s remembered (fingerprint, fingerprint_id) without setting anything up: a host whose worker command
    would build first (a masked copy on first use) has none yet, and a lookup must not start that build ahead of
    the run that shares it between hosts."""
    if not host.caches_fingerprint or not host.set_up():   # cache_key asks the rest
        return None
    return lookup(cache_key(host, session, require_providers))


def lookup(key: str | None) -> tuple[dict, str] | None:
    """(fingerprint, fingerprint_id) stored under `key`, if any (a damaged entry is a miss)."""
    if not key:
        return None
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text())
        fp, fid = data["fingerprint"], data["fingerprint_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(fp, dict) or worker.fingerprint_id(fp) != fid:
        return None
    return fp, fid


def store(key: str | None, fingerprint: dict, fid: str) -> None:
    if not key:
        return
    try:
        atomic_write_text(cache_dir() / f"{key}.json",
                          canonical_json({"fingerprint": fingerprint, "fingerprint_id": fid}) + "\n")
    except OSError:
        pass  # a read-only home only costs the next run a fingerprint
