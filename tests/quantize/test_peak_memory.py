"""calibrate's peak-memory figures leave the process's high-water mark alone, so the kernel's figure (getrusage,
/usr/bin/time -v) and quantbench's agree, and each step still gets its own peak."""

from __future__ import annotations

import resource

import numpy as np
import pytest

from quantbench.quantize.memory import PeakMeter, peak_rss_mib

MIB = 1 << 20


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key)) / 1024.0


def _touched(mib: int) -> np.ndarray:
    a = np.empty(mib * MIB, np.uint8)
    a[::4096] = 1     # every page resident
    return a


pytestmark = pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs Linux /proc")


def test_measuring_a_step_does_not_reset_the_processes_high_water_mark():
    big = _touched(300)
    del big                     # the high-water mark now stands well above the current RSS
    hwm, maxrss = _status_mib("VmHWM:"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with PeakMeter() as m:
        small = _touched(20)
    assert _status_mib("VmHWM:") >= hwm                                   # not reset (clear_refs would)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >= maxrss   # what /usr/bin/time reads
    assert m.mib < hwm - 200    # the step's own peak: far below the earlier one
    assert m.mib >= _status_mib("VmRSS:") - 1
    del small


def test_a_step_that_sets_a_new_high_water_mark_reports_it_exactly():
    before = peak_rss_mib()
    with PeakMeter() as m:
        big = _touched(int(before) + 100)   # far past any earlier peak
        del big
    assert m.mib == _status_mib("VmHWM:") and m.mib > before + 90
