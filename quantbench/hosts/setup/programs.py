"""Running the set-up's programs: one-line errors, progress lines, streamed output, waiting on a build another
command holds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from quantbench.errors import UserError


class SetupError(UserError):
    pass


class ProbeDied(SetupError):
    """The guest probe ended without its answer (`returncode`: negative for a signal)."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def say(progress: bool, msg: str) -> None:
    if progress:
        print(f"setup: {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], what: str, cwd: Path | None = None, env: dict | None = None,
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


def run_visible(argv: list[str], what: str, progress: bool) -> None:
    """Run a command whose own progress output (pip's download bars) the user should see."""
    if not progress:
        run(argv, what)
        return
    try:
        rc = subprocess.run(argv, stdout=sys.stderr).returncode
    except FileNotFoundError:
        raise SetupError(f"{what}: {argv[0]} not found") from None
    if rc != 0:
        raise SetupError(f"{what}: `{' '.join(argv[:3])} ...` failed (exit {rc}); its output is above")


def run_streamed(argv: list[str], what: str, desc: str, progress: bool, total: int | None = None,
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


def waiting(progress: bool, entry: Path):
    """What a setup says when another builder (a command or a thread) holds the entry it needs."""
    return lambda: say(progress, f"waiting for {entry} (another quantbench is building it) ...")
