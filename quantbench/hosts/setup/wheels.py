"""onnxruntime (+ numpy) wheels of a version for the guest's arch and Python, `pip install --target`, checked
before they are used."""

from __future__ import annotations

import re
import subprocess
import sys
import platform
import tempfile
import time
from pathlib import Path

from quantbench.errors import UserError
from quantbench.fsutil import atomic_write_json, build_once, entry_lock, read_cached_json, remove_tree
from quantbench.hosts import emulated
from quantbench.hosts import runtimes
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.setup.programs import SetupError, run_visible, say, waiting


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
    key = runtimes.site_key(version, arch, python)
    if key in _HAVE_WHEEL:
        return
    missing = read_cached_json(runtimes.missing_wheels_path()) or {}
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
    with entry_lock(runtimes.missing_wheels_path()):  # read-modify-write: another process may add its own version
        atomic_write_json(runtimes.missing_wheels_path(), dict(read_cached_json(runtimes.missing_wheels_path()) or {}, **{key: msg}))
    raise SetupError(msg)


def ensure_site(progress: bool, actions: list[str], ort_version: str | None = None) -> dict:
    """aarch64 wheels of onnxruntime `ort_version` (None: the local version) and numpy for the arm64 guest, installed
    once (fsutil.build_once: one builder, the others wait)."""
    ort_version = ort_version or local_ort_version()
    final, stamp_file = emulated.site_dir(ort_version), emulated.site_stamp(ort_version)
    t0 = time.monotonic()

    def done() -> dict | None:
        stamp = read_cached_json(stamp_file)
        return stamp if stamp is not None and final.exists() else None

    def build(tmp: Path) -> dict:
        check_wheel(ort_version, "aarch64", emulated.GUEST_PYTHON_VERSION, AARCH64_PLATFORMS)
        np_version = _local_numpy()
        base = [*AARCH64_PLATFORMS, "--python-version", emulated.GUEST_PYTHON_VERSION, "--implementation", "cp",
                "--only-binary=:all:", f"onnxruntime=={ort_version}"]
        say(progress, f"pip: aarch64 wheels onnxruntime=={ort_version}, numpy"
                       f"{'==' + np_version if np_version else ''} into {final} ...")
        # The same numpy as the local one where a wheel exists, so hashing code is the same.
        tries = [base + [f"numpy=={np_version}"], base + ["numpy"]] if np_version else [base + ["numpy"]]
        _pip_into(tmp, ort_version, tries, "pip install (aarch64 wheels)", progress)
        return {"onnxruntime": ort_version, "numpy": _dist_version(tmp, "numpy"),
                "python": emulated.GUEST_PYTHON_VERSION, "platform": "manylinux aarch64"}

    def publish(stamp: dict) -> dict:
        atomic_write_json(stamp_file, stamp)
        actions.append(f"wheels: onnxruntime {ort_version} + numpy {stamp['numpy']} (aarch64) into {final} "
                       f"({time.monotonic() - t0:.0f} s)")
        return stamp

    return build_once(final, done, build, publish, waiting=waiting(progress, final))[0]


def _local_numpy() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("numpy")
    except PackageNotFoundError:
        return ""


def ensure_local_site(ort_version: str, progress: bool, actions: list[str]) -> dict:
    """onnxruntime `ort_version` alone (--no-deps) for this interpreter, in its own folder that a local host
    puts first on its PYTHONPATH (this interpreter's numpy and the rest stay); installed once (fsutil.build_once)."""
    arch, python = platform.machine(), runtimes.local_python_version()
    final = runtimes.site_dir(ort_version, arch, python)
    t0 = time.monotonic()

    def done() -> dict | None:
        stamp = runtimes.read_stamp(final)
        return stamp if stamp is not None and final.exists() else None

    def build(tmp: Path) -> dict:
        check_wheel(ort_version, arch, python)
        say(progress, f"pip: onnxruntime=={ort_version} ({arch}, CPython {python}) into {final} ...")
        _pip_into(tmp, ort_version, [["--no-deps", "--only-binary=:all:", f"onnxruntime=={ort_version}"]],
                  "pip install (onnxruntime)", progress)
        return {"onnxruntime": ort_version, "python": python, "platform": arch}

    def publish(stamp: dict) -> dict:
        atomic_write_json(runtimes.stamp_of(final), stamp)
        actions.append(f"wheels: onnxruntime {ort_version} ({arch}) into {final} ({time.monotonic() - t0:.0f} s)")
        return stamp

    return build_once(final, done, build, publish, waiting=waiting(progress, final))[0]


def _pip_into(tmp: Path, ort_version: str, tries: list, what: str, progress: bool) -> None:
    """`pip install --target tmp` each argument list in turn until one works (the folder emptied between tries);
    then `tmp` must hold onnxruntime `ort_version`."""
    base = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-warn-script-location",
            "--target", str(tmp)]
    for i, args in enumerate(tries):
        try:
            run_visible(base + args, what, progress)
            break
        except UserError:
            if i == len(tries) - 1:
                raise
            remove_tree(tmp)
            tmp.mkdir()
    got = _dist_version(tmp, "onnxruntime")
    if got != ort_version:
        raise SetupError(f"{tmp}: pip installed onnxruntime {got or 'nothing'}, not {ort_version}")
