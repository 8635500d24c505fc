"""The arm64 root (and a Debian suite's runtime root): `debootstrap --foreign --variant=minbase --include=python3`,
then every downloaded .deb unpacked with `dpkg -x` (the second stage needs binfmt_misc, which sandboxes lack)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

from quantbench.fsutil import atomic_write_json, build_once, read_cached_json
from quantbench.hosts import emulated
from quantbench.hosts import runtimes
from quantbench.hosts.setup.apt import debian_mirror
from quantbench.hosts.setup.programs import SetupError, run, run_streamed, say, waiting


def ensure_root(progress: bool, actions: list[str]) -> dict:
    """The bookworm arm64 root the pip runtimes' guests run from (python3.11; wheels come on PYTHONPATH)."""
    def done() -> dict | None:
        stamp = read_cached_json(emulated.root_stamp())
        return stamp if stamp is not None and emulated.guest_python().exists() else None
    return build_root(emulated.root_dir(), "arm64", emulated.ROOT_SUITE, ("python3",), progress, actions, done,
                      python=emulated.GUEST_PYTHON_VERSION, what="arm64 root")


def ensure_debian_runtime(suite: str, arch: str, progress: bool, actions: list[str]) -> dict:
    """A Debian suite's python3-onnxruntime in its own root (quantbench.hosts.runtimes.debian_root)."""
    final = runtimes.debian_root(suite, arch)

    def done() -> dict | None:
        stamp = runtimes.read_stamp(final)
        return stamp if stamp is not None and runtimes.debian_python(suite, arch).exists() else None
    return build_root(final, runtimes.DEBIAN_ARCH[arch], suite, runtimes.DEBIAN_PACKAGES, progress, actions, done,
                      what=f"Debian {suite} onnxruntime ({runtimes.DEBIAN_ARCH[arch]})",
                      fixup=lambda tmp: _alternatives_links(tmp, runtimes.MULTIARCH[arch][0]))


def _alternatives_links(root: Path, multiarch: str) -> None:
    """The libblas.so.3 / liblapack.so.3 links the skipped maintainer scripts would make (update-alternatives);
    without them numpy fails to import with a misleading message about its source directory."""
    lib = root / "usr" / "lib" / multiarch
    for name, sub in (("libblas.so.3", "blas"), ("liblapack.so.3", "lapack")):
        if not (lib / name).exists() and (lib / sub / name).exists():
            os.symlink(f"{sub}/{name}", lib / name)


def _root_python(root: Path) -> str:
    """The X.Y of the root's python3.X (the highest one unpacked)."""
    found = sorted((p.name[len("python"):] for p in (root / "usr" / "bin").glob("python3.*")
                    if re.fullmatch(r"python3\.\d+", p.name)), key=lambda v: int(v.split(".")[1]))
    if not found:
        raise SetupError(f"{root}: no python3.X after unpacking")
    return found[-1]


def build_root(final: Path, deb_arch: str, suite: str, include, progress: bool, actions: list[str], done,
               python: str | None = None, what: str = "root", fixup=None) -> dict:
    """`debootstrap --foreign --variant=minbase --include=...` into `final` (the second stage needs binfmt_misc,
    which sandboxes lack, so every downloaded .deb is unpacked with `dpkg -x`), then `fixup(tmp)`; stamped. Built
    once (fsutil.build_once: `done()` is the stamp of a root in place; one builder, the others wait)."""
    t0 = time.monotonic()

    def build(tmp: Path) -> dict:
        if shutil.which("debootstrap") is None:
            raise SetupError("debootstrap not found; install it (Debian: apt-get install debootstrap)")
        mirror, _ = debian_mirror()
        say(progress, f"debootstrap --foreign {deb_arch} {suite} ({', '.join(include)}) into {final} "
                       f"(~20 s to minutes, 230-400 MB) ...")
        run_streamed(["debootstrap", "--foreign", f"--arch={deb_arch}", "--variant=minbase",
                       f"--include={','.join(include)}", suite, str(tmp), mirror], "debootstrap",
                      f"{what}: debootstrap", progress, total=None, count=re.compile(r"^I: (Retrieving|Extracting)"))
        archives = _unpack_archives(tmp, what, progress)
        if fixup is not None:
            fixup(tmp)
        got = _root_python(tmp)
        if python is not None and got != python:
            raise SetupError(f"{tmp}: {suite}'s python3 is {got}, not {python}")
        return {"suite": suite, "arch": deb_arch, "mirror": mirror, "packages": len(archives), "python": got,
                "include": list(include), "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def publish(stamp: dict) -> dict:
        atomic_write_json(runtimes.stamp_of(final), stamp)
        actions.append(f"{what}: debootstrap {suite} + {stamp['packages']} packages unpacked into {final} "
                       f"({time.monotonic() - t0:.0f} s, {_size_mb(final)} MB)")
        return stamp

    return build_once(final, done, build, publish, waiting=waiting(progress, final))[0]


def _unpack_archives(tmp: Path, what: str, progress: bool) -> list:
    """dpkg -x every .deb debootstrap downloaded into the root (then removed): the packages, unconfigured."""
    from tqdm import tqdm

    archives = sorted((tmp / "var" / "cache" / "apt" / "archives").glob("*.deb"))
    if not archives:
        raise SetupError(f"{tmp}: debootstrap downloaded no packages")
    for deb in tqdm(archives, desc=f"{what}: dpkg -x", unit="deb", disable=not progress, file=sys.stderr,
                    leave=False):
        run(["dpkg", "-x", str(deb), str(tmp)], f"dpkg -x {deb.name}")
    for deb in archives:
        deb.unlink()
    return archives


def _size_mb(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return round(total / 1e6)
