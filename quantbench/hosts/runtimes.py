"""The runtime a host carries: onnxruntime from PyPI at a pinned version, or a Debian suite's package.

A host's `runtime` option (hosts file, or a preset's default) says where its onnxruntime comes from:

  runtime = "pypi"            onnxruntime wheels (the default); the version is `onnxruntime = "1.20.1"`
                              in the hosts file or NAME@1.20.1 on the command line, else the local one
  runtime = "debian:trixie"   Debian trixie's python3-onnxruntime (1.21.0, with XNNPACK and oneDNN) in its
                              own root: under qemu-aarch64 for ARM hosts, with the root's own loader natively

Each version lives in its own folder under QUANTBENCH_HOME (quantbench.hosts.setup builds them):

  wheels/cp311-aarch64-onnxruntime-V/   an ARM guest's onnxruntime V + numpy (SITE on its PYTHONPATH)
  wheels/cp311-x86_64-onnxruntime-V/    onnxruntime V alone, first on a local host's PYTHONPATH (this
                                        interpreter and its numpy, another onnxruntime)
  wheels/missing.json                   versions pip has no wheel of for an architecture and Python
  debian/<suite>-<arch>/                a Debian root holding python3-onnxruntime; <suite>-<arch>.json its stamp

Plain layout and parsing: nothing here downloads or starts anything.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from quantbench.inputs.assets import quantbench_home
from quantbench.errors import UserError
from quantbench.fsutil import read_cached_json
from quantbench.hosts.keys import local_ort_version

#: onnxruntime versions as pip names them (1.20.1, 1.25.0.dev20260417008, 1.22.0rc1)
VERSION_RE = re.compile(r"\d+\.\d+(\.\d+)?([.]?(dev|rc|post|a|b)\d+)*")
#: Debian suites with python3-onnxruntime and the onnxruntime version each ships
DEBIAN_ORT = {"trixie": "1.21.0"}
#: what a Debian runtime root holds (libre2-11 is named: debootstrap does not resolve the virtual dependency)
DEBIAN_PACKAGES = ("python3-onnxruntime", "python3-numpy", "libre2-11")
#: Debian's architecture name for a machine architecture
DEBIAN_ARCH = {"aarch64": "arm64", "x86_64": "amd64"}
#: (multiarch folder, loader) of each architecture inside a Debian root
MULTIARCH = {"aarch64": ("aarch64-linux-gnu", "lib/ld-linux-aarch64.so.1"),
             "x86_64": ("x86_64-linux-gnu", "lib64/ld-linux-x86-64.so.2")}


@dataclass(frozen=True)
class Runtime:
    """Where a host's onnxruntime comes from: PyPI at `version` (None: the local version) or a Debian suite."""

    source: str  # "pypi" | "debian"
    suite: str = ""
    version: str | None = None

    @property
    def debian(self) -> bool:
        return self.source == "debian"

    @property
    def tag(self) -> str:
        """A folder-safe name of the runtime (prefix folders are keyed by it)."""
        return f"debian-{self.suite}" if self.debian else f"pypi-{self.version or 'local'}"

    def ort_version(self) -> str:
        """The onnxruntime version this runtime carries."""
        if self.debian:
            return DEBIAN_ORT[self.suite]
        return self.version or local_ort_version()

    def describe(self) -> str:
        return f"Debian {self.suite} onnxruntime {self.ort_version()}" if self.debian else \
            f"onnxruntime {self.ort_version()} (pip)"


def check_version(version, where: str) -> str:
    """`version` if it reads like an onnxruntime version; else a one-line error at `where`."""
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise UserError(f"{where}: onnxruntime version {version!r} is not a version like 1.20.1")
    return version


def parse_runtime(text, where: str) -> Runtime:
    """"pypi" or "debian:SUITE" (a suite that ships python3-onnxruntime)."""
    if text == "pypi":
        return Runtime("pypi")
    source, _, suite = str(text).partition(":")
    if source == "debian" and suite in DEBIAN_ORT:
        return Runtime("debian", suite)
    raise UserError(f"{where}: runtime {text!r}; choose from pypi, "
                    + ", ".join(f"debian:{s} (onnxruntime {v})" for s, v in DEBIAN_ORT.items()))


def runtime_of(options: dict, default: str = "pypi", where: str = "host") -> Runtime:
    """The runtime of a host's options (`runtime`, `onnxruntime`); `default`: its preset's runtime."""
    rt = parse_runtime(options.get("runtime", default), where)
    version = options.get("onnxruntime")
    if version is None:
        return rt
    check_version(version, where)
    if rt.debian:
        if version != rt.ort_version():
            raise UserError(f"{where}: runtime debian:{rt.suite} ships onnxruntime {rt.ort_version()} only, "
                            f"not {version}; use runtime \"pypi\" for another version")
        return rt
    return Runtime("pypi", version=version)


# --------------------------------------------------------------------------- layout


def python_tag(python_version: str) -> str:
    return "cp" + python_version.replace(".", "")


def local_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def site_key(version: str, arch: str, python_version: str) -> str:
    return f"{python_tag(python_version)}-{arch}-onnxruntime-{version}"


def site_dir(version: str, arch: str, python_version: str) -> Path:
    return quantbench_home() / "wheels" / site_key(version, arch, python_version)


def stamp_of(folder: Path) -> Path:
    """FOLDER.json beside FOLDER (not with_suffix: folder names hold version dots)."""
    return folder.parent / f"{folder.name}.json"


def missing_wheels_path() -> Path:
    return quantbench_home() / "wheels" / "missing.json"


def debian_root(suite: str, arch: str) -> Path:
    return quantbench_home() / "debian" / f"{suite}-{DEBIAN_ARCH[arch]}"


def read_stamp(folder: Path) -> dict | None:
    return read_cached_json(stamp_of(folder))


def debian_python(suite: str, arch: str) -> Path:
    """The root's python3.X (its stamp names it; python3 before the root exists)."""
    stamp = read_stamp(debian_root(suite, arch)) or {}
    return debian_root(suite, arch) / "usr" / "bin" / f"python{stamp.get('python', '3')}"


def debian_ready(suite: str, arch: str) -> tuple[bool, str]:
    root = debian_root(suite, arch)
    if read_stamp(root) is None or not debian_python(suite, arch).exists():
        return False, f"the Debian {suite} {DEBIAN_ARCH[arch]} root with python3-onnxruntime is missing ({root})"
    return True, f"Debian {suite} onnxruntime {DEBIAN_ORT[suite]} in {root}"


def native_debian_command(suite: str) -> tuple[list[str], dict]:
    """(argv prefix, environment changes) running the Debian root's python3 on this machine with the root's
    own loader and libraries (the machine's C library may be older than the root's)."""
    arch = "x86_64"
    root = debian_root(suite, arch)
    multiarch, loader = MULTIARCH[arch]
    libs = [root / "usr" / "lib" / multiarch, root / "lib" / multiarch, root / "usr" / "lib" / multiarch / "blas",
            root / "usr" / "lib" / multiarch / "lapack"]
    argv = [str(root / loader), "--library-path", ":".join(map(str, libs)), str(debian_python(suite, arch))]
    return argv, {"PYTHONHOME": str(root / "usr"), "PYTHONNOUSERSITE": "1"}


#: built-in local hosts that run another runtime natively (registry.builtin_hosts): name -> host options.
#: x86-dnnl: this machine with Debian trixie's onnxruntime 1.21.0 (amd64): oneDNN, then the CPU provider
NATIVE_PRESETS = {
    "x86-dnnl": {"runtime": "debian:trixie"},
}
#: their deployed sessions (hosts.deploy.deployed_session reads a spec's session)
NATIVE_SESSIONS = {
    "x86-dnnl": {"providers": ["DnnlExecutionProvider", "CPUExecutionProvider"]},
}


def same_version(a: str, b: str) -> bool:
    """1.21 and 1.21.0 are one version (Debian's build reports the short form)."""
    def parts(v):
        p = str(v).split(".")
        while len(p) > 2 and p[-1] == "0":
            p.pop()
        return p + ["0"] * (2 - len(p))
    return parts(a) == parts(b)


def version_check(host: str, rt: Runtime, remote: str) -> None:
    """An error when a host's worker imported another onnxruntime than the runtime set up for it."""
    want = rt.ort_version()
    if remote and not same_version(remote, want):
        raise UserError(f"host {host}: its worker imported onnxruntime {remote}, not the {want} of its runtime "
                        f"({rt.describe()}); rerun `quantbench hosts setup {host}`")
    return None


def start_failure(rt: Runtime, cpu: str, exc) -> str | None:
    """'onnxruntime 1.21.0 does not start on Cortex-A72: SIGILL at import' for a worker killed by an illegal
    instruction before it answered (a build using instructions the CPU lacks); None for any other death."""
    import signal

    if getattr(exc, "returncode", None) != -signal.SIGILL:
        return None
    return f"onnxruntime {rt.ort_version()} does not start on {cpu}: SIGILL at import"

