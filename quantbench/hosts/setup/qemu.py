"""qemu-user: Debian trixie's qemu-user 10 (static-pie binaries that run on Debian 12), fetched as a .deb with a
private apt configuration and unpacked into tools/; falls back to the qemu-user on PATH (Debian 12: 7.2). Nothing is
installed system-wide."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from quantbench.errors import UserError
from quantbench.fsutil import (atomic_write_json, atomic_write_text, build_once, read_cached_json, remove_tree,
                               replace_dir, temp_beside)
from quantbench.hosts import emulated
from quantbench.hosts.setup.apt import apt_options, debian_mirror
from quantbench.hosts.setup.programs import SetupError, run, say, waiting


QEMU_SUITE = "trixie"
QEMU_PACKAGE = "qemu-user"
QEMU_ARCHES = ("aarch64", "x86_64")


def _qemu_ok(record: dict | None, need: tuple[int, int, int]) -> bool:
    if not record:
        return False
    for arch in QEMU_ARCHES:
        entry = record.get(arch)
        if not entry or not Path(entry["path"]).exists():
            return False
    return tuple(record.get("version", (0, 0, 0))) >= need


def fetch_trixie_qemu(progress: bool) -> dict:
    """Download Debian trixie's qemu-user .deb with a private apt config; unpack qemu-aarch64/x86_64."""
    mirror, keyring = debian_mirror()
    apt_dir = emulated.home() / "tools" / "apt"
    for sub in ("sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial", "debs"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    signed = f" [signed-by={keyring}]" if Path(keyring).exists() else ""
    atomic_write_text(apt_dir / "sources.list", f"deb{signed} {mirror} {QEMU_SUITE} main\n")
    atomic_write_text(apt_dir / "preferences", "")
    opts = apt_options(apt_dir)
    say(progress, f"apt-get update (private config, suite {QEMU_SUITE}) ...")
    run(["apt-get", "-q", *opts, "update"], f"apt-get update for {QEMU_SUITE}")
    debs = apt_dir / "debs"
    for old in debs.glob("*.deb"):
        old.unlink()
    say(progress, f"apt-get download {QEMU_PACKAGE}/{QEMU_SUITE} (~70 MB) ...")
    run(["apt-get", "-q", *opts, "download", f"{QEMU_PACKAGE}/{QEMU_SUITE}"], f"apt-get download {QEMU_PACKAGE}",
         cwd=debs)
    found = sorted(debs.glob(f"{QEMU_PACKAGE}_*.deb"))
    if not found:
        raise SetupError(f"{debs}: apt-get download left no {QEMU_PACKAGE} .deb")
    deb = found[-1]
    pkg_version = run(["dpkg-deb", "-f", str(deb), "Version"], f"{deb}: reading its version").strip()
    tools = emulated.home() / "tools"
    tmp = temp_beside(tools / "qemu")  # this builder's own; fetch_trixie_qemu runs under ensure_qemu's lock
    try:
        final = _unpack_qemu(deb, tmp, progress)
    except BaseException:
        remove_tree(tmp)
        raise
    deb.unlink()
    source = f"Debian {QEMU_SUITE} {QEMU_PACKAGE} {pkg_version} (unpacked into {final})"
    return {"version": list(emulated.qemu_version(final / "qemu-aarch64")), "source": source,
            **{arch: {"path": str(final / f"qemu-{arch}"), "source": source} for arch in QEMU_ARCHES}}


def _unpack_qemu(deb: Path, tmp: Path, progress: bool) -> Path:
    """qemu-aarch64 and qemu-x86_64 out of the .deb into `tmp`, then moved to tools/qemu-<version>."""
    wanted = {f"./usr/bin/qemu-{arch}": arch for arch in QEMU_ARCHES}
    say(progress, f"unpacking {', '.join('qemu-' + a for a in QEMU_ARCHES)} from {deb.name} ...")
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    got = {}
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                arch = wanted.get(member.name)
                if arch and member.isfile():
                    src = tar.extractfile(member)
                    dest = tmp / f"qemu-{arch}"
                    with open(dest, "wb") as fh:
                        shutil.copyfileobj(src, fh)
                    dest.chmod(0o755)
                    got[arch] = dest
                    if len(got) == len(wanted):
                        break
    finally:
        proc.stdout.close()
        proc.kill()
        proc.wait()
    if len(got) != len(wanted):
        raise SetupError(f"{deb}: does not hold {', '.join(sorted(wanted))} as plain files")
    return replace_dir(tmp, tmp.parent / f"qemu-{emulated.version_text(emulated.qemu_version(got['aarch64']))}")


def system_qemu() -> dict | None:
    paths = {arch: shutil.which(f"qemu-{arch}") for arch in QEMU_ARCHES}
    if not all(paths.values()):
        return None
    version = emulated.qemu_version(paths["aarch64"])
    source = f"qemu-user on PATH ({emulated.version_text(version)})"
    return {"version": list(version), "source": source,
            **{arch: {"path": str(p), "source": source} for arch, p in paths.items()}}


def ensure_qemu(need: tuple[int, int, int], progress: bool, actions: list[str]) -> dict:
    """The qemu record (tools/qemu.json): Debian trixie's qemu-user fetched once (fsutil.build_once: one builder,
    the others wait), else the qemu on PATH."""
    def done() -> dict | None:
        record = read_cached_json(emulated.tools_record_path())
        if _qemu_ok(record, need) and record.get("preferred", False):
            return record
        if _qemu_ok(record, need) and record.get("fetch_failed_at", 0) > time.time() - 86400:
            return record  # fell back to the system qemu today already; do not retry the download every run
        return None

    def build(tmp: Path) -> dict:
        new = _fetch_or_fall_back(progress, actions)
        atomic_write_json(tmp, new)
        return new

    return build_once(emulated.tools_record_path(), done, build, folder=False,
                      waiting=waiting(progress, emulated.tools_record_path()))[0]


def _fetch_or_fall_back(progress: bool, actions: list[str]) -> dict:
    t0 = time.monotonic()
    try:
        new = fetch_trixie_qemu(progress)
        new["preferred"] = True
        actions.append(f"qemu: {new['source']} ({time.monotonic() - t0:.0f} s)")
    except UserError as exc:
        new = system_qemu()
        if new is None:
            raise SetupError(f"qemu-user: fetching Debian {QEMU_SUITE}'s {QEMU_PACKAGE} failed ({exc}) and no "
                             "qemu-aarch64/qemu-x86_64 is on PATH; install qemu-user (apt-get install qemu-user)") from None
        new["preferred"] = False
        new["fetch_failed_at"] = time.time()
        new["fetch_error"] = str(exc)
        actions.append(f"qemu: Debian {QEMU_SUITE}'s {QEMU_PACKAGE} unavailable ({exc}); using {new['source']}")
    return new
