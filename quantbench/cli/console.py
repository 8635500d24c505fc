"""Command-line manners shared by every command: one argument group and one output session.

The *output* group (quantbench.cli.groups.OutputArgs; cli.py adds it to every command, and to each action of a
command with sub-actions):

- ``-q/--quiet``: no summary text (errors still go to stderr; the exit code says it all);
- ``-v/--verbose``: library warnings (onnxruntime's C++ log, the quantizer's
  ``WARNING:root:`` lines, Python warnings) shown in full as they happen;
- ``--json``: the summary as JSON on stdout (commands with their own JSON print it;
  for the others stdout is captured and wrapped as ``{"command", "exit_code", "lines"}``);
- ``--no-progress``: no progress bars. Bars are drawn only when stderr is a terminal
  (tqdm's ``disable=None``), so logs and CI output never hold them.

`session(args)` is the context a command runs in: it captures the warnings and at the
end prints one line, e.g. ``12 warnings from onnxruntime (-v to show)``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
import threading
import warnings
from dataclasses import dataclass, field

COMMON = ("quiet", "verbose", "json", "no_progress")
# lines on fd 2 that are library warnings, not our output: onnxruntime's C++ log, with or without its colour and
# its timestamp ("\x1b[0;93m2026-12-02 01:19:54.414343251 [W:onnxruntime:, graph.cc:1492 Graph] Initializer ...")
_LIB_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? )?\[(W|I|V):onnxruntime"
                       r"|^(WARNING|INFO):(root|onnxruntime)")


def progress_enabled(args) -> bool:
    """Bars only on a terminal, never with --no-progress, -q or --json."""
    if getattr(args, "no_progress", False) or getattr(args, "quiet", False):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@dataclass
class Captured:
    """Library warnings seen while a command ran, by origin."""

    lines: list = field(default_factory=list)   # (origin, text)

    def counts(self) -> dict:
        out: dict = {}
        for origin, _ in self.lines:
            out[origin] = out.get(origin, 0) + 1
        return out

    def summary(self, verbose: bool) -> str | None:
        if not self.lines:
            return None
        parts = [f"{n} warning{'s' if n != 1 else ''} from {o}" for o, n in sorted(self.counts().items())]
        return ", ".join(parts) + (" (shown above)" if verbose else " (-v to show)")


def _origin(name: str, text: str = "") -> str:
    return "onnxruntime" if ("onnxruntime" in name or "onnxruntime" in text or name == "root") else "python"


class _Handler(logging.Handler):
    def __init__(self, cap: Captured, echo):
        super().__init__(logging.WARNING)
        self.cap, self.echo = cap, echo

    def emit(self, record):
        try:
            text = f"{record.levelname}:{record.name}:{record.getMessage()}"
        except Exception:  # a bad format string in a library's log call
            text = f"{record.levelname}:{record.name}:{record.msg!r}"
        self.cap.lines.append((_origin(record.name, record.pathname or ""), text))
        if self.echo:
            self.echo(text)


#: the real fd 2 while _fd2_capture stands a pipe in for it (a duplicate of it, outermost first)
_REAL_FD2: list = []


def before_exec() -> None:
    """Before this process replaces itself with a command (os.exec*, `hosts exec`): fd 2 is the real stderr again;
    the thread that reads the pipe standing in for it does not survive the exec (the command's writes to stderr
    were a broken pipe)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if _REAL_FD2:
        os.dup2(_REAL_FD2[0], 2)


@contextlib.contextmanager
def _fd2_capture(cap: Captured, verbose: bool):
    """Route C-level writes to fd 2 (onnxruntime's C++ logger) through a filter thread.

    Python's own stderr (our messages, tqdm) is moved to a duplicate of the real fd 2 first,
    so it is neither delayed nor filtered. Skipped when sys.stderr is not fd 2 (under a test
    harness that replaced it).
    """
    try:
        real = sys.stderr.fileno() == 2
    except (AttributeError, ValueError, io.UnsupportedOperation):
        real = False
    if not real or os.environ.get("QUANTBENCH_NO_FD_CAPTURE"):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    _REAL_FD2.append(saved)
    r, w = os.pipe()
    out = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="replace")

    def pump():
        with os.fdopen(r, "rb") as fh:
            for raw in fh:
                text = raw.decode("utf-8", "replace").rstrip("\n")
                if _LIB_LINE.search(text):
                    cap.lines.append(("onnxruntime", text))
                    if not verbose:
                        continue
                out.write(text + "\n")
                out.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    old = sys.stderr
    os.dup2(w, 2)
    os.close(w)
    sys.stderr = out
    try:
        yield
    finally:
        sys.stderr = old
        with contextlib.suppress(Exception):
            old.flush()
        os.dup2(saved, 2)
        _REAL_FD2.remove(saved)
        os.close(saved)
        t.join(timeout=2)
        with contextlib.suppress(Exception):
            out.close()


@contextlib.contextmanager
def session(args, command: str):
    """Run one command: warnings captured, -q / fallback --json stdout handled; yields the capture."""
    verbose = bool(getattr(args, "verbose", 0))
    quiet = bool(getattr(args, "quiet", False))
    as_json = bool(getattr(args, "json", False))
    wrap = as_json and not getattr(args, "_json_native", False)
    cap = Captured()

    def echo(text):
        sys.stderr.write(text + "\n")

    handler = _Handler(cap, echo if verbose else None)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)  # root now has a handler: logging.warning() no longer calls basicConfig
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    buf = io.StringIO()
    state = {"rc": None}
    with warnings.catch_warnings():
        def show(message, category, filename, lineno, file=None, line=None):
            text = f"{category.__name__}: {message} ({os.path.basename(filename)}:{lineno})"
            cap.lines.append((_origin(filename), text))
            if verbose:
                echo(text)

        warnings.showwarning = show
        try:
            with _fd2_capture(cap, verbose):
                if wrap:
                    with contextlib.redirect_stdout(buf):
                        yield state
                elif quiet and not as_json:
                    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                        yield state
                else:
                    yield state
        finally:
            root.removeHandler(handler)
            root.setLevel(old_level)
            line = cap.summary(verbose)
            if line and not quiet:
                sys.stderr.write(line + "\n")
    if wrap:
        lines = buf.getvalue().splitlines()
        print(json.dumps({"command": command, "exit_code": state["rc"], "lines": lines,
                          "warnings": cap.counts()}, indent=2, sort_keys=True))
