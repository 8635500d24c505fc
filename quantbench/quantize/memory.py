"""Peak resident memory of this process, per step.

Linux keeps the process's peak RSS in /proc/self/status (VmHWM); writing "5"
to /proc/self/clear_refs resets it, so each step's own peak can be read.
Where that is not possible the process-wide peak (ru_maxrss) is reported.
"""

from __future__ import annotations

import resource
import sys


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / (1024.0 * 1024.0) if sys.platform == "darwin" else kb / 1024.0


class PeakMeter:
    """with PeakMeter() as m: ...; m.mib is the peak RSS during the block (process peak if no reset)."""

    def __enter__(self):
        self.scoped = reset_peak()
        self.mib = 0.0
        return self

    def __exit__(self, *exc):
        self.mib = peak_rss_mib()
        return False
