"""Builds what emulated hosts need under QUANTBENCH_HOME (layout: quantbench.hosts.emulated).

Steps, each skipped when its stamp file says it is done, and each built once per entry (fsutil.build_once: a
lock beside the entry, a temporary folder of the builder's own, an atomic rename; a second command or thread
waits, then uses the finished entry):
  1. qemu-user: Debian trixie's qemu-user 10 (static-pie binaries that run on Debian 12),
     fetched as a .deb with a private apt configuration and unpacked into tools/;
     falls back to the qemu-user on PATH (Debian 12: 7.2). Nothing is installed system-wide.
  2. the arm64 root: `debootstrap --foreign --variant=minbase --include=python3`, then
     every downloaded .deb unpacked with `dpkg -x` (the second stage needs binfmt_misc,
     which sandboxes lack).
  3. aarch64 wheels of the local onnxruntime version (+ numpy), `pip install --target`.
  4. one qemu -L prefix per preset, with a /proc/cpuinfo matching the emulated CPU,
     verified by importing onnxruntime in the guest and reading back the MIDR and HWCAP.
The Debian mirror is the machine's own (its apt sources), or QUANTBENCH_DEBIAN_MIRROR.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import platform
import tarfile
import tempfile
import time
from pathlib import Path

from quantbench.errors import UserError
from quantbench.fsutil import (atomic_write_json, atomic_write_text, build_once, entry_lock, read_cached_json,
                               remove_tree, replace_dir, temp_beside)
from quantbench.hosts import emulated as E
from quantbench.hosts import runtimes as R
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.kinds import KINDS
from quantbench.hosts.worker import ARM64_HWCAP, ARM64_HWCAP2, X86_FLAGS, decode_bits, x86_identity

QEMU_SUITE = "trixie"
QEMU_PACKAGE = "qemu-user"
QEMU_ARCHES = ("aarch64", "x86_64")
DEBIAN_SUITES = {"buster", "bullseye", "bookworm", "trixie", "forky", "sid", "stable", "testing", "unstable",
                 "oldstable"}
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Top-level folders of the arm64 root NOT linked into a prefix: paths the guest opens
# there (temporary files, home folders, /proc, /dev) must resolve to the host's.
PREFIX_SKIP = {"proc", "sys", "dev", "run", "tmp", "home", "root", "mnt", "media", "srv", "opt", "boot"}
BOGOMIPS = "108.00"  # what a Raspberry Pi 4/5 kernel reports; informational only


class SetupError(UserError):
    pass


class ProbeDied(SetupError):
    """The guest probe ended without its answer (`returncode`: negative for a signal)."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"setup: {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], what: str, cwd: Path | None = None, env: dict | None = None,
         timeout: float = 1800) -> str:
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SetupError(f"{what}: {argv[0]} not found; install it (Debian: apt-get install {argv[0]})") from None
    except subprocess.TimeoutExpired:
        raise SetupError(f"{what}: `{' '.join(argv[:3])} ...` took longer than {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
        raise SetupError(f"{what}: `{' '.join(argv[:3])} ...` failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


def _run_visible(argv: list[str], what: str, progress: bool) -> None:
    """Run a command whose own progress output (pip's download bars) the user should see."""
    if not progress:
        _run(argv, what)
        return
    try:
        rc = subprocess.run(argv, stdout=sys.stderr).returncode
    except FileNotFoundError:
        raise SetupError(f"{what}: {argv[0]} not found") from None
    if rc != 0:
        raise SetupError(f"{what}: `{' '.join(argv[:3])} ...` failed (exit {rc}); its output is above")


def _run_streamed(argv: list[str], what: str, desc: str, progress: bool, total: int | None = None,
                  count: re.Pattern | None = None, env: dict | None = None) -> None:
    """Run a long command, advancing a tqdm bar per matching output line."""
    from tqdm import tqdm

    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    except FileNotFoundError:
        raise SetupError(f"{what}: {argv[0]} not found; install it (Debian: apt-get install {argv[0]})") from None
    tail: list[str] = []
    with tqdm(total=total, desc=desc, unit="step", disable=not progress, file=sys.stderr, leave=False) as bar:
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-5:]
            if count is None or count.search(line):
                bar.update(1)
    rc = proc.wait()
    if rc != 0:
        raise SetupError(f"{what}: `{' '.join(argv[:3])} ...` failed (exit {rc}): {' | '.join(tail[-3:])}")


def _waiting(progress: bool, entry: Path):
    """What a setup says when another builder (a command or a thread) holds the entry it needs."""
    return lambda: _say(progress, f"waiting for {entry} (another quantbench is building it) ...")


# --------------------------------------------------------------------------- Debian mirror


def _deb822_entries(text: str) -> list[dict]:
    entries = []
    for para in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in para.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "uris" not in fields:
            continue
        entries.append({"types": fields.get("types", "").split(), "uris": fields["uris"].split(),
                        "suites": fields.get("suites", "").split(), "components": fields.get("components", "").split(),
                        "signed_by": fields.get("signed-by", "")})
    return entries


def _one_line_entries(text: str) -> list[dict]:
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        opts = ""
        m = re.match(r"^(deb|deb-src)\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        opts = m.group(2) or ""
        signed = re.search(r"signed-by=(\S+?)[\s\]]", opts + " ")
        entries.append({"types": [m.group(1)], "uris": [m.group(3)], "suites": [m.group(4)],
                        "components": m.group(5).split(), "signed_by": signed.group(1) if signed else ""})
    return entries


def apt_entries(etc: Path = Path("/etc/apt")) -> list[dict]:
    """Every enabled apt source of the machine (one-line .list and deb822 .sources files)."""
    out = []
    files = [etc / "sources.list"] + sorted((etc / "sources.list.d").glob("*.list")) + \
        sorted((etc / "sources.list.d").glob("*.sources"))
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        out += _deb822_entries(text) if f.suffix == ".sources" else _one_line_entries(text)
    return out


def debian_mirror(etc: Path = Path("/etc/apt")) -> tuple[str, str]:
    """(mirror URI, keyring) of the machine's Debian archive, read from its apt sources.

    The mirror is never hard-coded: it is the entry serving a Debian release suite
    (not -security/-updates/-backports) with the main component.
    """
    override = os.environ.get("QUANTBENCH_DEBIAN_MIRROR")
    if override:
        return override.rstrip("/"), DEFAULT_KEYRING
    for entry in apt_entries(etc):
        if "deb" not in entry["types"] or "main" not in entry["components"]:
            continue
        if any(s in DEBIAN_SUITES for s in entry["suites"]):
            keyring = entry["signed_by"] if entry["signed_by"].startswith("/") else DEFAULT_KEYRING
            return entry["uris"][0].rstrip("/"), keyring
    raise SetupError(f"{etc}: no Debian archive (a bookworm/trixie suite with component main) in the apt "
                     "sources; set QUANTBENCH_DEBIAN_MIRROR to a Debian mirror URI")


# --------------------------------------------------------------------------- 1. qemu


def _qemu_ok(record: dict | None, need: tuple[int, int, int]) -> bool:
    if not record:
        return False
    for arch in QEMU_ARCHES:
        entry = record.get(arch)
        if not entry or not Path(entry["path"]).exists():
            return False
    return tuple(record.get("version", (0, 0, 0))) >= need


def _apt_options(apt_dir: Path) -> list[str]:
    opts = [f"-o=Dir::Etc::SourceList={apt_dir / 'sources.list'}",
            f"-o=Dir::Etc::SourceParts={apt_dir / 'sources.list.d'}",
            f"-o=Dir::Etc::Preferences={apt_dir / 'preferences'}",
            f"-o=Dir::Etc::PreferencesParts={apt_dir / 'preferences.d'}",
            f"-o=Dir::State::Lists={apt_dir / 'lists'}",
            f"-o=Dir::Cache={apt_dir / 'cache'}",
            "-o=APT::Get::List-Cleanup=0",
            "-o=Acquire::Languages=none"]
    if os.geteuid() == 0:
        opts.append("-o=APT::Sandbox::User=root")  # the private folders are not readable by _apt
    return opts


def fetch_trixie_qemu(progress: bool) -> dict:
    """Download Debian trixie's qemu-user .deb with a private apt config; unpack qemu-aarch64/x86_64."""
    mirror, keyring = debian_mirror()
    apt_dir = E.home() / "tools" / "apt"
    for sub in ("sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial", "debs"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    signed = f" [signed-by={keyring}]" if Path(keyring).exists() else ""
    atomic_write_text(apt_dir / "sources.list", f"deb{signed} {mirror} {QEMU_SUITE} main\n")
    atomic_write_text(apt_dir / "preferences", "")
    opts = _apt_options(apt_dir)
    _say(progress, f"apt-get update (private config, suite {QEMU_SUITE}) ...")
    _run(["apt-get", "-q", *opts, "update"], f"apt-get update for {QEMU_SUITE}")
    debs = apt_dir / "debs"
    for old in debs.glob("*.deb"):
        old.unlink()
    _say(progress, f"apt-get download {QEMU_PACKAGE}/{QEMU_SUITE} (~70 MB) ...")
    _run(["apt-get", "-q", *opts, "download", f"{QEMU_PACKAGE}/{QEMU_SUITE}"], f"apt-get download {QEMU_PACKAGE}",
         cwd=debs)
    found = sorted(debs.glob(f"{QEMU_PACKAGE}_*.deb"))
    if not found:
        raise SetupError(f"{debs}: apt-get download left no {QEMU_PACKAGE} .deb")
    deb = found[-1]
    pkg_version = _run(["dpkg-deb", "-f", str(deb), "Version"], f"{deb}: reading its version").strip()
    tools = E.home() / "tools"
    tmp = temp_beside(tools / "qemu")  # this builder's own; fetch_trixie_qemu runs under ensure_qemu's lock
    try:
        final = _unpack_qemu(deb, tmp, progress)
    except BaseException:
        remove_tree(tmp)
        raise
    deb.unlink()
    source = f"Debian {QEMU_SUITE} {QEMU_PACKAGE} {pkg_version} (unpacked into {final})"
    return {"version": list(E.qemu_version(final / "qemu-aarch64")), "source": source,
            **{arch: {"path": str(final / f"qemu-{arch}"), "source": source} for arch in QEMU_ARCHES}}


def _unpack_qemu(deb: Path, tmp: Path, progress: bool) -> Path:
    """qemu-aarch64 and qemu-x86_64 out of the .deb into `tmp`, then moved to tools/qemu-<version>."""
    wanted = {f"./usr/bin/qemu-{arch}": arch for arch in QEMU_ARCHES}
    _say(progress, f"unpacking {', '.join('qemu-' + a for a in QEMU_ARCHES)} from {deb.name} ...")
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
    return replace_dir(tmp, tmp.parent / f"qemu-{E.version_text(E.qemu_version(got['aarch64']))}")


def system_qemu() -> dict | None:
    paths = {arch: shutil.which(f"qemu-{arch}") for arch in QEMU_ARCHES}
    if not all(paths.values()):
        return None
    version = E.qemu_version(paths["aarch64"])
    source = f"qemu-user on PATH ({E.version_text(version)})"
    return {"version": list(version), "source": source,
            **{arch: {"path": str(p), "source": source} for arch, p in paths.items()}}


def ensure_qemu(need: tuple[int, int, int], progress: bool, actions: list[str]) -> dict:
    """The qemu record (tools/qemu.json): Debian trixie's qemu-user fetched once (fsutil.build_once: one builder,
    the others wait), else the qemu on PATH."""
    def done() -> dict | None:
        record = read_cached_json(E.tools_record_path())
        if _qemu_ok(record, need) and record.get("preferred", False):
            return record
        if _qemu_ok(record, need) and record.get("fetch_failed_at", 0) > time.time() - 86400:
            return record  # fell back to the system qemu today already; do not retry the download every run
        return None

    def build(tmp: Path) -> dict:
        new = _fetch_or_fall_back(progress, actions)
        atomic_write_json(tmp, new)
        return new

    return build_once(E.tools_record_path(), done, build, folder=False,
                      waiting=_waiting(progress, E.tools_record_path()))[0]


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


# --------------------------------------------------------------------------- 2. arm64 root


def ensure_root(progress: bool, actions: list[str]) -> dict:
    """The bookworm arm64 root the pip runtimes' guests run from (python3.11; wheels come on PYTHONPATH)."""
    def done() -> dict | None:
        stamp = read_cached_json(E.root_stamp())
        return stamp if stamp is not None and E.guest_python().exists() else None
    return build_root(E.root_dir(), "arm64", E.ROOT_SUITE, ("python3",), progress, actions, done,
                      python=E.GUEST_PYTHON_VERSION, what="arm64 root")


def ensure_debian_runtime(suite: str, arch: str, progress: bool, actions: list[str]) -> dict:
    """A Debian suite's python3-onnxruntime in its own root (quantbench.hosts.runtimes.debian_root)."""
    final = R.debian_root(suite, arch)

    def done() -> dict | None:
        stamp = R.read_stamp(final)
        return stamp if stamp is not None and R.debian_python(suite, arch).exists() else None
    return build_root(final, R.DEBIAN_ARCH[arch], suite, R.DEBIAN_PACKAGES, progress, actions, done,
                      what=f"Debian {suite} onnxruntime ({R.DEBIAN_ARCH[arch]})",
                      fixup=lambda tmp: _alternatives_links(tmp, R.MULTIARCH[arch][0]))


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
        _say(progress, f"debootstrap --foreign {deb_arch} {suite} ({', '.join(include)}) into {final} "
                       f"(~20 s to minutes, 230-400 MB) ...")
        _run_streamed(["debootstrap", "--foreign", f"--arch={deb_arch}", "--variant=minbase",
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
        atomic_write_json(R.stamp_of(final), stamp)
        actions.append(f"{what}: debootstrap {suite} + {stamp['packages']} packages unpacked into {final} "
                       f"({time.monotonic() - t0:.0f} s, {_size_mb(final)} MB)")
        return stamp

    return build_once(final, done, build, publish, waiting=_waiting(progress, final))[0]


def _unpack_archives(tmp: Path, what: str, progress: bool) -> list:
    """dpkg -x every .deb debootstrap downloaded into the root (then removed): the packages, unconfigured."""
    from tqdm import tqdm

    archives = sorted((tmp / "var" / "cache" / "apt" / "archives").glob("*.deb"))
    if not archives:
        raise SetupError(f"{tmp}: debootstrap downloaded no packages")
    for deb in tqdm(archives, desc=f"{what}: dpkg -x", unit="deb", disable=not progress, file=sys.stderr,
                    leave=False):
        _run(["dpkg", "-x", str(deb), str(tmp)], f"dpkg -x {deb.name}")
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


# --------------------------------------------------------------------------- 3. wheels


def _dist_version(site: Path, name: str) -> str:
    for d in site.glob(f"{name}-*.dist-info"):
        return d.name[len(name) + 1:-len(".dist-info")]
    return ""


#: site keys pip had a wheel for (this process asked already)
_HAVE_WHEEL: set = set()
AARCH64_PLATFORMS = ("--platform", "manylinux2014_aarch64", "--platform", "manylinux_2_28_aarch64")


def check_wheel(version: str, arch: str, python: str, platform_args=()) -> None:
    """A one-line error when pip has no onnxruntime `version` wheel for `arch` and CPython `python`, naming the
    versions that have one (pip's own list); a version found missing is remembered (wheels/missing.json)."""
    key = R.site_key(version, arch, python)
    if key in _HAVE_WHEEL:
        return
    missing = read_cached_json(R.missing_wheels_path()) or {}
    if key in missing:
        raise SetupError(missing[key])
    with tempfile.TemporaryDirectory(prefix="quantbench-wheel-") as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                "--only-binary=:all:", "--dest", tmp, *platform_args, "--python-version", python,
                "--implementation", "cp", f"onnxruntime=={version}"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise SetupError(f"pip download onnxruntime=={version}: no answer within 600 s") from None
    if proc.returncode == 0:
        _HAVE_WHEEL.add(key)
        return
    found = re.search(r"\(from versions: (?!none\))([^)]*)\)", proc.stderr)  # pip's list of what it found
    if found is None:  # offline, or no index ("from versions: none"): not a fact about the version
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SetupError(f"pip download onnxruntime=={version} ({arch}, CPython {python}) failed: {tail}")
    msg = (f"onnxruntime {version}: no wheel for {arch} CPython {python}; versions with one: "
           f"{found.group(1).strip()}")
    with entry_lock(R.missing_wheels_path()):  # read-modify-write: another process may add its own version
        atomic_write_json(R.missing_wheels_path(), dict(read_cached_json(R.missing_wheels_path()) or {}, **{key: msg}))
    raise SetupError(msg)


def ensure_site(progress: bool, actions: list[str], ort_version: str | None = None) -> dict:
    """aarch64 wheels of onnxruntime `ort_version` (None: the local version) and numpy for the arm64 guest, installed
    once (fsutil.build_once: one builder, the others wait)."""
    ort_version = ort_version or local_ort_version()
    final, stamp_file = E.site_dir(ort_version), E.site_stamp(ort_version)
    t0 = time.monotonic()

    def done() -> dict | None:
        stamp = read_cached_json(stamp_file)
        return stamp if stamp is not None and final.exists() else None

    def build(tmp: Path) -> dict:
        check_wheel(ort_version, "aarch64", E.GUEST_PYTHON_VERSION, AARCH64_PLATFORMS)
        np_version = _local_numpy()
        base = [*AARCH64_PLATFORMS, "--python-version", E.GUEST_PYTHON_VERSION, "--implementation", "cp",
                "--only-binary=:all:", f"onnxruntime=={ort_version}"]
        _say(progress, f"pip: aarch64 wheels onnxruntime=={ort_version}, numpy"
                       f"{'==' + np_version if np_version else ''} into {final} ...")
        # The same numpy as the local one where a wheel exists, so hashing code is the same.
        tries = [base + [f"numpy=={np_version}"], base + ["numpy"]] if np_version else [base + ["numpy"]]
        _pip_into(tmp, ort_version, tries, "pip install (aarch64 wheels)", progress)
        return {"onnxruntime": ort_version, "numpy": _dist_version(tmp, "numpy"),
                "python": E.GUEST_PYTHON_VERSION, "platform": "manylinux aarch64"}

    def publish(stamp: dict) -> dict:
        atomic_write_json(stamp_file, stamp)
        actions.append(f"wheels: onnxruntime {ort_version} + numpy {stamp['numpy']} (aarch64) into {final} "
                       f"({time.monotonic() - t0:.0f} s)")
        return stamp

    return build_once(final, done, build, publish, waiting=_waiting(progress, final))[0]


def _local_numpy() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("numpy")
    except PackageNotFoundError:
        return ""


def ensure_local_site(ort_version: str, progress: bool, actions: list[str]) -> dict:
    """onnxruntime `ort_version` alone (--no-deps) for this interpreter, in its own folder that a local host
    puts first on its PYTHONPATH (this interpreter's numpy and the rest stay); installed once (fsutil.build_once)."""
    arch, python = platform.machine(), R.local_python_version()
    final = R.site_dir(ort_version, arch, python)
    t0 = time.monotonic()

    def done() -> dict | None:
        stamp = R.read_stamp(final)
        return stamp if stamp is not None and final.exists() else None

    def build(tmp: Path) -> dict:
        check_wheel(ort_version, arch, python)
        _say(progress, f"pip: onnxruntime=={ort_version} ({arch}, CPython {python}) into {final} ...")
        _pip_into(tmp, ort_version, [["--no-deps", "--only-binary=:all:", f"onnxruntime=={ort_version}"]],
                  "pip install (onnxruntime)", progress)
        return {"onnxruntime": ort_version, "python": python, "platform": arch}

    def publish(stamp: dict) -> dict:
        atomic_write_json(R.stamp_of(final), stamp)
        actions.append(f"wheels: onnxruntime {ort_version} ({arch}) into {final} ({time.monotonic() - t0:.0f} s)")
        return stamp

    return build_once(final, done, build, publish, waiting=_waiting(progress, final))[0]


def _pip_into(tmp: Path, ort_version: str, tries: list, what: str, progress: bool) -> None:
    """`pip install --target tmp` each argument list in turn until one works (the folder emptied between tries);
    then `tmp` must hold onnxruntime `ort_version`."""
    base = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-warn-script-location",
            "--target", str(tmp)]
    for i, args in enumerate(tries):
        try:
            _run_visible(base + args, what, progress)
            break
        except UserError:
            if i == len(tries) - 1:
                raise
            remove_tree(tmp)
            tmp.mkdir()
    got = _dist_version(tmp, "onnxruntime")
    if got != ort_version:
        raise SetupError(f"{tmp}: pip installed onnxruntime {got or 'nothing'}, not {ort_version}")


# --------------------------------------------------------------------------- 4. prefixes

# Runs in the guest: what the emulated process sees (auxv, /proc/cpuinfo, x86 CPUID).
PROBE = r'''
import json, platform, struct, sys
out = {"arch": platform.machine()}
try:
    data = open("/proc/self/auxv", "rb").read()
    for i in range(0, len(data) - 15, 16):
        k, v = struct.unpack_from("<QQ", data, i)
        if k == 16: out["hwcap"] = v
        if k == 26: out["hwcap2"] = v
except OSError:
    pass
try:
    out["cpuinfo"] = open("/proc/cpuinfo").read()
except OSError:
    out["cpuinfo"] = ""
if platform.machine() == "aarch64":  # PR_SVE_GET_VL, PR_SME_GET_VL: the vector lengths in bits, 0 when absent
    import ctypes
    prctl = ctypes.CDLL(None).prctl
    for key, option in (("sve_vector_bits", 51), ("sme_vector_bits", 64)):
        got = prctl(option, 0, 0, 0, 0)
        out[key] = (got & 0xffff) * 8 if got > 0 else 0
if platform.machine() in ("x86_64", "AMD64"):
    import ctypes, mmap
    code = bytes([0x53, 0x49, 0x89, 0xd0, 0x89, 0xf8, 0x89, 0xf1, 0x0f, 0xa2, 0x41, 0x89, 0x00,
                  0x41, 0x89, 0x58, 0x04, 0x41, 0x89, 0x48, 0x08, 0x41, 0x89, 0x50, 0x0c, 0x5b, 0xc3])
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)(
        ctypes.addressof(ctypes.c_char.from_buffer(buf)))
    regs = (ctypes.c_uint32 * 4)()
    def cpuid(leaf, sub=0):
        fn(leaf, sub, ctypes.addressof(regs))
        return list(regs)
    out["cpuid"] = {}
    top = cpuid(0)[0]
    for leaf, sub in ((0, 0), (1, 0), (7, 0), (7, 1), (0xd, 1)):
        if leaf <= top:
            out["cpuid"]["%x.%x" % (leaf, sub)] = cpuid(leaf, sub)
    ext = cpuid(0x80000000)[0]
    for leaf in (0x80000001, 0x80000002, 0x80000003, 0x80000004):
        if leaf <= ext:
            out["cpuid"]["%x.0" % leaf] = cpuid(leaf)
if "--import" in sys.argv:
    import onnxruntime, numpy
    out["onnxruntime"] = onnxruntime.__version__
    out["numpy"] = numpy.__version__
print("PROBE " + json.dumps(out))
'''

def run_probe(argv_prefix: list[str], env: dict, import_ort: bool, timeout: float = 600) -> dict:
    argv = argv_prefix + ["-c", PROBE] + (["--import"] if import_ort else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SetupError(f"guest probe `{' '.join(argv_prefix[:3])} ...` took longer than {timeout:.0f} s") from None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    if proc.returncode != 0 or line is None:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise ProbeDied(f"guest probe `{' '.join(argv_prefix[:3])} ...` failed ({how}){': ' + tail if tail else ''}",
                        proc.returncode)
    return json.loads(line[len("PROBE "):])


def arm_features(hwcap: int, hwcap2: int) -> list[str]:
    """Feature names in the kernel's /proc/cpuinfo order (HWCAP bits, then HWCAP2 bits)."""
    return decode_bits(hwcap, ARM64_HWCAP) + decode_bits(hwcap2, ARM64_HWCAP2)


def arm_cpuinfo(p: E.Preset, features: list[str], cpus: int) -> str:
    block = (f"BogoMIPS\t: {BOGOMIPS}\nFeatures\t: {' '.join(features)}\nCPU implementer\t: 0x{p.implementer:02x}\n"
             f"CPU architecture: 8\nCPU variant\t: 0x{p.variant:x}\nCPU part\t: 0x{p.part:03x}\n"
             f"CPU revision\t: {p.revision}\n")
    return "".join(f"processor\t: {i}\n{block}\n" for i in range(cpus))


def x86_cpuinfo(cpuid: dict, cpus: int) -> tuple[str, list[str]]:
    """A /proc/cpuinfo naming the emulated model, with the flags its CPUID reports."""
    ident = x86_identity(cpuid)
    flags = [name for leaf, reg, bit, name in X86_FLAGS if name in ident["flags"]]
    block = (f"vendor_id\t: {ident['vendor_id']}\ncpu family\t: {ident['cpu_family']}\nmodel\t\t: {ident['model']}\n"
             f"model name\t: {ident['model_name']}\nstepping\t: {ident['stepping']}\nflags\t\t: {' '.join(flags)}\n")
    return "".join(f"processor\t: {i}\n{block}\n" for i in range(cpus)), flags


def _check_seen(p: E.Preset, seen_cpuinfo: str, features: list[str], vectors: dict | None = None) -> None:
    """The guest must see the preset's identity, features and (ARM) vector lengths, or the prefix is wrong."""
    missing = [f for f in p.expect_features if f not in features]
    extra = [f for f in p.absent_features if f in features]
    if missing or extra:
        raise SetupError(f"{p.name}: the guest on qemu -cpu {p.cpu_option} sees features {' '.join(features)}; "
                         f"expected {' '.join(p.expect_features)} and none of {' '.join(p.absent_features)}")
    want = {"sve_vector_bits": p.sve_bits, "sme_vector_bits": p.sme_bits}
    if vectors is not None and {k: vectors.get(k, 0) for k in want} != want:
        raise SetupError(f"{p.name}: the guest on qemu -cpu {p.cpu_option} has SVE {vectors.get('sve_vector_bits', 0)} "
                         f"and SME {vectors.get('sme_vector_bits', 0)} bits, not {p.sve_bits} and {p.sme_bits}")
    if p.part is not None and f"CPU part\t: 0x{p.part:03x}" not in seen_cpuinfo:
        got = re.search(r"CPU part\s*:\s*(\S+)", seen_cpuinfo)
        raise SetupError(f"{p.name}: the guest /proc/cpuinfo shows CPU part {got.group(1) if got else 'none'}, "
                         f"not 0x{p.part:03x}")


def _probe_guest(name: str, p, binary: str, tmp: Path, env: dict, cpus: int, progress: bool,
                 rt: R.Runtime | None = None) -> tuple[list, str, list]:
    """The guest's argv under the prefix `tmp` (an arm64 prefix links the root of runtime `rt` in and points at
    its site; `env` is adjusted), and the /proc/cpuinfo text and features qemu's CPU model shows, probed without
    onnxruntime."""
    if p.arch == "aarch64":
        root = E.guest_root(rt)
        for entry in sorted(root.iterdir()):
            if entry.name not in PREFIX_SKIP:
                os.symlink(entry, tmp / entry.name)
        for k in ("PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYTHONPATH"):
            env.pop(k, None)
        if rt is None:
            env["PYTHONPATH"] = str(E.site_dir())
        env["PYTHONNOUSERSITE"] = "1"
        argv = [binary, "-cpu", p.cpu_option, "-L", str(tmp), str(E.guest_python(rt))]
        # First pass without onnxruntime (which would crash on qemu 7.2 without an ARM cpuinfo):
        # the HWCAP bits qemu gives this CPU model become the cpuinfo Features line.
        _say(progress, f"{name}: probing qemu -cpu {p.cpu_option} ...")
        seen = run_probe(argv, env, import_ort=False)
        features = arm_features(seen.get("hwcap", 0), seen.get("hwcap2", 0))
        return argv, arm_cpuinfo(p, features, cpus), features
    argv = [binary, "-cpu", p.qemu_cpu, "-L", str(tmp), sys.executable]
    _say(progress, f"{name}: probing qemu -cpu {p.qemu_cpu} (CPUID) ...")
    seen = run_probe(argv, env, import_ort=False)
    text, features = x86_cpuinfo(seen["cpuid"], cpus)
    return argv, text, features


def _prefix_key(p: E.Preset, binary: str, version: str, rt: R.Runtime | None) -> dict:
    """What a prefix is made from (a change remakes it): qemu, the CPU model, the root (and the default site)."""
    key = {"qemu": binary, "qemu_version": version, "qemu_cpu": p.cpu_option, "midr": p.midr_text}
    if p.arch != "aarch64":
        return dict(key, root=None, site=sys.executable)
    if rt is not None and rt.debian:
        return dict(key, root=R.read_stamp(E.guest_root(rt)), site=rt.tag)
    return dict(key, root=read_cached_json(E.root_stamp()), site=E.site_key(local_ort_version()))


def ensure_prefix(name: str, qemu: dict, progress: bool, actions: list[str], rt: R.Runtime | None = None) -> dict:
    """The qemu -L prefix of preset `name` over the root of runtime `rt` (None or a pip runtime: the preset's
    own root), verified by importing onnxruntime in the guest."""
    p = E.preset(name)
    full = rt or E.runtime_of(name)
    rt = full if full.debian else None  # a pip runtime of any version runs on the preset's bookworm root
    binary = qemu[p.arch]["path"]
    version = E.version_text(E.qemu_version(binary))
    key = _prefix_key(p, binary, version, rt)
    final = E.prefix_dir(name, full)
    t0 = time.monotonic()

    def done() -> dict | None:
        stamp = read_cached_json(E.stamp_path(final))
        ok = stamp is not None and {k: stamp.get(k) for k in key} == key and (final / "proc" / "cpuinfo").exists()
        return stamp if ok else None

    def publish(stamp: dict) -> dict:
        atomic_write_json(E.stamp_path(final), stamp)
        failure = f"; onnxruntime does not start there ({stamp['import_failure']})" if stamp["import_failure"] else ""
        actions.append(f"{name}: prefix {final} for qemu {version} -cpu {p.cpu_option}; guest /proc/cpuinfo from "
                       f"{stamp['cpuinfo_source']}; features {' '.join(stamp['features'])}{failure} "
                       f"({time.monotonic() - t0:.0f} s)")
        return stamp

    return build_once(final, done, lambda tmp: _build_prefix(name, p, binary, tmp, rt, progress, key), publish,
                      waiting=_waiting(progress, final))[0]


def _build_prefix(name: str, p: E.Preset, binary: str, tmp: Path, rt: R.Runtime | None, progress: bool,
                  key: dict) -> dict:
    """Fill the prefix folder `tmp`: the root linked in, the /proc/cpuinfo of the CPU model; verified; its stamp."""
    (tmp / "proc").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QEMU_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(dict(p.env))
    argv, text, features = _probe_guest(name, p, binary, tmp, env, os.cpu_count() or 1, progress, rt)
    atomic_write_text(tmp / "proc" / "cpuinfo", text)
    check = _verify_import(name, p, argv, env, rt, progress)
    cpuinfo_source = "prefix" if check["cpuinfo"] == text else "qemu (emulated /proc/cpuinfo)"
    return dict(key, features=features, cpuinfo_source=cpuinfo_source, guest_onnxruntime=check.get("onnxruntime"),
                guest_numpy=check.get("numpy"), import_failure=check.get("import_failure"))


def _verify_import(name: str, p: E.Preset, argv: list, env: dict, rt: R.Runtime | None, progress: bool) -> dict:
    """The guest's view with onnxruntime imported, checked against the preset. A Debian runtime that dies of
    SIGILL on this CPU is kept (its hosts report that it does not start), with `import_failure` saying so."""
    _say(progress, f"{name}: importing onnxruntime in the guest to verify ...")
    try:
        check = run_probe(argv, env, import_ort=True)
    except ProbeDied as exc:
        if rt is None or exc.returncode != -signal.SIGILL:
            raise
        check = dict(run_probe(argv, env, import_ort=False), import_failure="SIGILL at import")
    vectors = None
    if p.arch == "aarch64":
        seen_features = arm_features(check.get("hwcap", 0), check.get("hwcap2", 0))
        vectors = check
    else:
        seen_features = (re.search(r"^flags\s*:\s*(.*)$", check["cpuinfo"], re.M) or [None, ""])[1].split()
    _check_seen(p, check["cpuinfo"], seen_features, vectors)
    want = rt.ort_version() if rt is not None else local_ort_version()
    if p.arch == "aarch64" and not check.get("import_failure") and not R.same_version(check.get("onnxruntime"), want):
        raise SetupError(f"{name}: the guest imported onnxruntime {check.get('onnxruntime')}, not {want}")
    return check


# --------------------------------------------------------------------------- entry point


def setup_hosts(specs, progress: bool = True) -> list[str]:
    """Make the named hosts (registry.HostSpec) ready, idempotently: emulated hosts with the runtime each
    carries (a version's wheels, a Debian root), local hosts with another runtime; returns what was done."""
    pairs, local = [], []
    for spec in specs:
        way = KINDS[spec.kind].setup_as
        if way == "qemu-root":
            name = spec.options.get("preset", spec.name)
            pairs.append((name, E.runtime_of(name, spec.options)))
        elif way == "runtime" and not spec.options.get("python") and R.runtime_of(spec.options).tag != "pypi-local":
            local.append(R.runtime_of(spec.options, where=f"host {spec.name}"))
        else:
            raise UserError(f"hosts setup: host {spec.name!r} is kind {spec.kind} with its own onnxruntime; only "
                            "emulated hosts, masked x86 tiers and local hosts with another runtime need setup")
    actions = setup_emulated(pairs, progress) if pairs else []
    for rt in dict.fromkeys(local):
        _ensure_local_runtime(rt, progress, actions)
    return actions


def first_use_setup(host) -> bool:
    """Set up a host (a host object: name, kind, options) carrying a runtime other than the default (a
    version, a Debian root) at its first use, progress on stderr; False for a host on the default runtime
    (`quantbench hosts setup` prepares those)."""
    rt = getattr(host, "runtime", None)
    if rt is None or not (rt.debian or rt.version):
        return False
    for action in setup_hosts([host]):
        print(f"setup: {action}", file=sys.stderr, flush=True)
    return True


def _ensure_local_runtime(rt: R.Runtime, progress: bool, actions: list[str]) -> None:
    """Another pip version for this interpreter, or a Debian root checked by importing its onnxruntime here."""
    if not rt.debian:
        ensure_local_site(rt.version, progress, actions)
        return
    made = not R.debian_ready(rt.suite, platform.machine())[0]
    ensure_debian_runtime(rt.suite, platform.machine(), progress, actions)
    if made:
        argv, changes = R.native_debian_command(rt.suite)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        check = run_probe(argv, dict(env, **changes), import_ort=True)
        if not R.same_version(check.get("onnxruntime"), rt.ort_version()):
            raise SetupError(f"{R.debian_root(rt.suite, platform.machine())}: its python3 imported onnxruntime "
                             f"{check.get('onnxruntime')}, not {rt.ort_version()}")
        actions.append(f"Debian {rt.suite} onnxruntime {check['onnxruntime']} starts here (numpy {check['numpy']})")


def _ensure_runtimes(presets: list, progress: bool, actions: list[str]) -> None:
    """The roots and wheel folders the (preset, runtime) pairs run from."""
    arm = [rt for p, rt in presets if p.arch == "aarch64"]
    if any(not rt.debian for rt in arm):
        ensure_root(progress, actions)
        ensure_site(progress, actions)  # the default prefixes are verified with the local version
    for p, rt in dict.fromkeys(presets):
        if p.arch == "aarch64" and rt.debian:
            ensure_debian_runtime(rt.suite, "aarch64", progress, actions)
        elif p.arch == "aarch64" and rt.version:
            ensure_site(progress, actions, rt.version)
        elif rt.debian:
            raise SetupError(f"{p.name}: a Debian runtime runs on ARM presets and on local hosts, not under "
                             f"qemu-{p.arch}")
        elif rt.version:
            ensure_local_site(rt.version, progress, actions)


def setup_emulated(pairs: list, progress: bool = True) -> list[str]:
    """Make each (preset name, runtime or None: its own) ready (idempotent); returns what was done."""
    presets = list(dict.fromkeys((E.preset(n), rt or E.runtime_of(n)) for n, rt in pairs))
    if not presets:
        return []
    actions: list[str] = []
    for p, rt in presets:  # a version without a wheel fails before anything is fetched
        if rt.version:
            check_wheel(rt.version, p.arch, E.GUEST_PYTHON_VERSION if p.arch == "aarch64" else
                        R.local_python_version(), AARCH64_PLATFORMS if p.arch == "aarch64" else ())
    qemu = ensure_qemu(max(p.min_qemu for p, _ in presets), progress, actions)
    _ensure_runtimes(presets, progress, actions)
    failed = []
    for p, rt in presets:
        if tuple(qemu["version"]) < p.min_qemu:
            # Not an error: the other presets work; `hosts list` shows why this one is not ready.
            actions.append(f"{p.name}: not ready: {p.qemu_cpu} needs qemu >= {E.version_text(p.min_qemu)}, "
                           f"the qemu in use is {E.version_text(qemu['version'])} ({qemu['source']})")
            continue
        try:
            ensure_prefix(p.name, qemu, progress, actions, rt)
        except UserError as exc:  # the other presets still get set up
            failed.append(str(exc))
    if failed:
        for action in actions:
            print(action)
        raise SetupError("hosts setup failed for " + "; ".join(failed))
    return actions
