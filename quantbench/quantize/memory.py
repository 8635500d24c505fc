"""Peak resident memory of this process during a step, measured without resetting anything.

The kernel keeps the process's high-water mark (VmHWM in /proc/self/status, which
``getrusage`` and ``/usr/bin/time -v`` report as the maximum RSS). It is never reset here
(writing /proc/self/clear_refs would, and would make those outside tools under-report), so a
step's own peak is read as:

- VmHWM at the step's end, when it rose during the step: the step set a new high-water mark,
  and that is its peak, exactly;
- otherwise the largest VmRSS a sampling thread saw during the step (every SAMPLE_SECONDS;
  a spike shorter than that, below the earlier high-water mark, can be missed).

Where /proc is missing the process-wide peak (ru_maxrss) is reported.
"""

from __future__ import annotations

import resource
import sys
import threading

SAMPLE_SECONDS = 0.01


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_mib() -> float:
    """The process's peak RSS so far (VmHWM; ru_maxrss where /proc is missing), MiB."""
    kib = _status_kib("VmHWM:")
    if kib is not None:
        return kib / 1024.0
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / (1024.0 * 1024.0) if sys.platform == "darwin" else kb / 1024.0


class PeakMeter:
    """with PeakMeter() as m: ...; m.mib is the peak RSS during the block (see the module's doc), the process's
    high-water mark left as it is."""

    def __enter__(self):
        self.mib = 0.0
        self._hwm0 = _status_kib("VmHWM:")
        self._seen = _status_kib("VmRSS:") or 0
        self._stop = threading.Event()
        self._thread = None
        if self._hwm0 is not None:
            self._thread = threading.Thread(target=self._sample, name="quantbench-peak-meter", daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._seen = max(self._seen, _status_kib("VmRSS:") or 0)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        hwm = _status_kib("VmHWM:")
        if hwm is None or self._hwm0 is None:
            self.mib = peak_rss_mib()
        else:
            seen = max(self._seen, _status_kib("VmRSS:") or 0)
            self.mib = (hwm if hwm > self._hwm0 else min(seen, hwm)) / 1024.0
        return False
