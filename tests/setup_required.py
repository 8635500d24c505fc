"""Missing setup (an emulated host, sshd) skips a test on a developer's machine, but
fails it under CI (CI=true): the README's test command runs `scripts/setup.sh --for-tests` first, so
there a missing host is a broken setup, not a reason to pass quietly."""

import os

import pytest


def missing_setup(message: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"setup incomplete under CI: {message}")
    pytest.skip(f"setup missing on this machine: {message}; `bash scripts/setup.sh --for-tests` sets it up (under CI=true "
                "this is a failure, not a skip)")


def need_tier(name: str) -> None:
    """A masked x86 tier for a test. A tier this CPU cannot show is a fact about the CPU (a CPUID mask only takes
    features away): the test is skipped saying which features it lacks, here and under CI alike. A missing
    mechanism (no gcc, no objdump) is missing setup."""
    from quantbench.hosts import cpuprofiles as P
    from quantbench.hosts import masked as M

    p = P.PROFILES[name]
    lacks = P.missing_here(p, M.here_features())
    if lacks:
        pytest.skip(f"this CPU cannot show {name}: it lacks {', '.join(lacks)} (a fact, not missing setup)")
    why = M.masked_unavailable(p)
    if why:
        missing_setup(f"masked {name}: {why}")
