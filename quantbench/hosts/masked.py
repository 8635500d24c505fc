"""Masked x86 tier hosts: this machine's CPU, natively, with CPUID saying it is an older (or other) x86 tier.

The worker is this interpreter running a masked copy of onnxruntime and numpy (every `cpuid` replaced by
`ud2`; quantbench.hosts.cpuidpatch) with the CPUID shim LD_PRELOADed (cpuid_shim.c): each trapped CPUID
returns the profile's answer (quantbench.hosts.cpuprofiles), so MLAS, numpy and OpenBLAS dispatch that
tier's kernels at native speed. GLIBC_TUNABLES masks glibc's own start-up dispatch (libm, memcpy) the same
way. The worker's fingerprint reads the features through the shim and fails if a masked one is still
visible (cpu_mechanism "native-masked").

A tier name (x86-sse4, x86-avx, x86-avx2, x86-avx512, x86-vnni, x86-avxvnni, x86-amx, x86-zen2, x86-zen4)
runs masked when the mechanism works here and the profile's features are a subset of this CPU's; else
under qemu where qemu has the model (an emulated preset); else it is listed as not available, with why.
`NAME:masked` / `NAME:qemu` (or `mechanism = "masked" | "qemu"` in the hosts file) forces one way.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from quantbench.hosts import cpuidpatch
from quantbench.hosts import cpuprofiles
from quantbench import worker
from quantbench.errors import UserError
from quantbench.hosts.process import UNMASKED_ENV, WORKER_PATH, ProcessHost, without_process_mask

MECHANISMS = ("masked", "qemu")


@functools.lru_cache(maxsize=1)
def here_features() -> tuple[str, ...]:
    """This CPU's features as CPUID reports them to an unmasked process (empty off x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ()
    cpuid, _ = worker.cpuid_function()
    return tuple(worker.x86_identity(worker.cpuid_leaves(cpuid))["flags"])


def masked_unavailable(p: cpuprofiles.Profile) -> str | None:
    """Why the masked mechanism cannot run this profile here (None: it can)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"masked x86 tiers need an x86-64 machine (this is {platform.machine()})"
    missing = cpuprofiles.missing_here(p, here_features())
    if missing:
        return f"this CPU lacks {', '.join(missing)} (a CPUID mask can only take features away)"
    if not cpuidpatch.shim_path().exists() and not (shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")):
        return "no C compiler (gcc) to build the CPUID shim"
    if not shutil.which("objdump") and not cpuidpatch.state()[0]:
        return "no objdump (Debian package binutils) to find the cpuid instructions to patch"
    return None


def unshowable(spec) -> list[str] | None:
    """The profile's features of a masked tier host this CPU cannot show (it lacks some of them: a fact about
    the CPU, so equiv predicts the tier instead of running it); None for any other host."""
    if spec.kind != "masked" or spec.options.get("mechanism", "masked") != "masked":
        return None
    p = cpuprofiles.profile(spec.options.get("profile", spec.name))
    if p is None or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    return list(p.features) if cpuprofiles.missing_here(p, here_features()) else None


def check_showable(specs, where: str) -> None:
    """Each masked tier host of `specs` is one this CPU shows, else one UserError naming it and what the CPU lacks
    (`hosts setup x86-zen4` on a CPU without AVX-512 said "already set up": nothing can set it up here)."""
    for spec in specs:
        if unshowable(spec) is not None:
            why = masked_unavailable(cpuprofiles.profile(spec.options.get("profile", spec.name)))
            raise UserError(f"{where} {spec.name}: {why}; no setup makes this CPU show it (equiv predicts the tier "
                            f"from measured hosts; a machine that shows it runs it)")


def shown_tiers(names) -> list[tuple[str, str | None]]:
    """(tier, why not) per named x86 tier: None where this CPU shows it masked, else why it does not (the CPU lacks
    a feature, is no x86-64, ...): a fact of the machine, decided where it runs (a CI runner's CPU is unknown when
    its workflow is written)."""
    out = []
    for name in names:
        p = cpuprofiles.profile(name)
        if p is None:
            raise UserError(f"unknown x86 tier {name!r}; tiers: {', '.join(cpuprofiles.PROFILES)}")
        out.append((name, masked_unavailable(p)))
    return out


def tier_choice(profile_name: str, mechanism: str | None) -> tuple[str, dict]:
    """(kind, options) of a tier host: masked where it works (or is forced), else the qemu preset, else a
    masked host that says why it is not available."""
    p = cpuprofiles.PROFILES[profile_name]
    if mechanism == "qemu" and p.qemu_preset:
        return "emulated", {"preset": p.qemu_preset}
    if mechanism is None and masked_unavailable(p) and p.qemu_preset:
        return "emulated", {"preset": p.qemu_preset}
    return "masked", {"profile": profile_name, "mechanism": mechanism or "masked"}


def worker_env(p: cpuprofiles.Profile, site, shim) -> dict:
    """The masked worker's environment: the masked copy first on sys.path, the shim preloaded, the profile. It
    starts from the environment without any whole-process mask (a mask replaces another, never stacks on it)."""
    env = {k: v for k, v in without_process_mask(dict(os.environ)).items()
           if not k.startswith(("QUANTBENCH_CPUID_", "QUANTBENCH_CPU_MECHANISM"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x])
    env["LD_PRELOAD"] = " ".join([str(shim)] + env.get("LD_PRELOAD", "").split())
    env["QUANTBENCH_CPUID_PROFILE"] = cpuprofiles.encode(p)
    env["QUANTBENCH_CPUID_PROFILE_NAME"] = p.name
    env["QUANTBENCH_CPUID_BRAND"] = p.brand
    env["QUANTBENCH_CPUID_ROOT"] = os.path.realpath(site) + os.sep  # the shim reads real paths in /proc/self/maps
    env["QUANTBENCH_CPUID_SITES"] = str(Path(site).parent / "cpuid-sites.tsv")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("OPENBLAS_CORETYPE", None)  # OpenBLAS reads the masked CPUID itself
    hwcaps = cpuprofiles.glibc_hwcaps(p)
    if hwcaps:
        env["GLIBC_TUNABLES"] = ":".join(x for x in (env.get("GLIBC_TUNABLES", ""), hwcaps) if x)
    return env


def process_env(profile_name: str, progress: bool = True) -> dict:
    """The environment that runs a whole command under a tier's mask (`hosts exec`): what a worker of that tier
    gets, plus the variables it changed as they were (process.UNMASKED_ENV), so that workers not running the
    masked copy take the mask off again (process.without_process_mask)."""
    p = cpuprofiles.profile(profile_name)
    if p is None:
        raise UserError(f"unknown x86 tier {profile_name!r}; tiers: {', '.join(cpuprofiles.PROFILES)}")
    why = masked_unavailable(p)
    if why:
        raise UserError(f"{profile_name}: not available here: {why}")
    setup_masked(progress)
    env = worker_env(p, cpuidpatch.site_dir(), cpuidpatch.shim_path())
    base = without_process_mask(dict(os.environ))  # under another mask: as it was before that one
    before = {k: base.get(k) for k in sorted(set(env) | set(base))
              if env.get(k) != base.get(k) and not k.startswith("QUANTBENCH_CPUID_")}
    env[UNMASKED_ENV] = json.dumps(before, sort_keys=True)
    return env


def setup_masked(progress: bool = True) -> list[str]:
    """Build the masked copy and the shim when missing (idempotent); what was done."""
    actions = []
    shim, built = cpuidpatch.ensure_shim(progress)
    if built:
        actions.append(f"masked: built the CPUID shim {shim}")
    site, stamp, built = cpuidpatch.ensure_site(progress)
    if built:
        sites = sum(f["cpuid_sites"] for f in stamp["files"].values())
        actions.append(f"masked: {site}: {sites} cpuid instructions patched in {len(stamp['files'])} libraries")
    return actions


@dataclass
class MaskedHost(ProcessHost):
    """This machine's CPU under a CPUID profile (see the module docstring)."""

    #: the profile, the masked copy's stamp and the shim are all on this machine
    caches_fingerprint = True

    @property
    def profile(self) -> cpuprofiles.Profile | None:
        return cpuprofiles.profile(self.options.get("profile", self.name))

    def ready(self) -> tuple[bool, str]:
        p = self.profile
        if p is None:
            return False, f"unknown x86 tier profile {self.options.get('profile')!r}; profiles: {', '.join(cpuprofiles.PROFILES)}"
        if self.options.get("mechanism") == "qemu":
            return False, f"not available here: qemu has no CPU model for {p.description} (qemu emulates no AVX-512, VNNI or AMX)"
        why = masked_unavailable(p)
        if why:
            return False, f"not available here: {why}"
        ok, msg = cpuidpatch.state()
        return True, f"native-masked: {p.description}" + ("" if ok else " (the masked copy is built on first use)")

    def set_up(self) -> bool:
        return cpuidpatch.state()[0]

    def command(self):
        p = self.profile
        setup_masked(progress=False)
        env = worker_env(p, cpuidpatch.site_dir(), cpuidpatch.shim_path())
        return [sys.executable, "-u", str(WORKER_PATH)], env, b""

    def describe(self) -> str:
        p = self.profile
        return f"native-masked ({p.description if p else self.options.get('profile')})"

    def fingerprint_cache_parts(self, env: dict) -> dict:
        """The profile as the shim gets it, the masked copy's stamp and the shim's build."""
        stamp = cpuidpatch.stamp_path()
        return {"masked": {"profile": env.get("QUANTBENCH_CPUID_PROFILE", ""), "glibc": env.get("GLIBC_TUNABLES", ""),
                           "stamp": stamp.read_text() if stamp.exists() else "", "shim": str(cpuidpatch.shim_path())}}

    def latency_refusal(self) -> str | None:
        return ("native-masked; it runs the tier's kernels on this machine's cores, so a time measured here is "
                "not that CPU's latency")
