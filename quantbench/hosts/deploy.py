"""The session a host deploys: its ordered execution providers and session options.

Each layer overrides the one before: the worker's defaults (CPU provider, one thread), the host's preset (the
real device's defaults: a Raspberry Pi 5 running onnxruntime's defaults uses 4 intra-op threads), the hosts
file's keys for that host, then the command line (`--threads`, `--providers`, `--graph-opt`, ...; for every
host of the run):

    lab = { kind = "emulated", preset = "pi", providers = ["XnnpackExecutionProvider", "CPUExecutionProvider"],
            intra_op_num_threads = 2 }

A run has one session per host (runs.runner.RunPlan.sessions); it is in each result's run key, so results
under another session are recomputed, never mixed. A thread count is always explicit: under qemu-user
onnxruntime's default (0) would be this machine's core count, not the device's, so 0 means the host's own
deployed count.
"""

from __future__ import annotations

from quantbench.errors import UserError
from quantbench.hosts import emulated
from quantbench import worker
from quantbench.hosts.keys import normalize_session, session_options

#: hosts-file keys that set a host's session
HOST_SESSION_KEYS = ("providers", "intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level",
                     "execution_mode")
_CHOICES = {"graph_optimization_level": worker.GRAPH_OPT_LEVELS, "execution_mode": ("sequential", "parallel")}


def check_host_session(name: str, entry: dict, where: str) -> dict:
    """The session keys of one hosts-file entry, each checked (a one-line UserError naming FILE:LINE)."""
    out = {}
    for key in HOST_SESSION_KEYS:
        if key not in entry:
            continue
        value = entry[key]
        if key == "providers":
            if not (isinstance(value, list) and value and all(isinstance(p, str) and p.strip() for p in value)):
                raise UserError(f'{where}: host {name!r}: providers must be a list of execution provider names, in '
                                f'priority order, e.g. ["XnnpackExecutionProvider", "CPUExecutionProvider"]')
            value = [p.strip() for p in value]
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise UserError(f"{where}: host {name!r}: {key} {value!r}; choose from {', '.join(_CHOICES[key])}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{where}: host {name!r}: {key} must be a whole number of threads, at least 1 (got "
                            f"{value!r:.40})")
        out[key] = value
    return out


def preset_session(spec) -> dict:
    """The session options an emulated host's preset carries (its device's defaults); {} for other kinds."""
    if spec.kind != "emulated":
        return {}
    p = emulated.PRESETS.get(spec.options.get("preset", spec.name))
    if p is None:
        return {}
    return {"providers": list(p.providers), "intra_op_num_threads": p.intra_op_threads}


def deployed_session(spec, overrides: dict | None = None, recorded: dict | None = None) -> dict:
    """The normalised session `spec` (a registry.HostSpec) runs under: defaults < preset < hosts file <
    `overrides` (config entries merge key by key). `recorded`: the session a host's results were made under
    (an imported file's, host.recorded_session()), taken instead of the preset when the hosts file sets none.
    A thread count of 0 is the host's own deployed count."""
    own = getattr(spec, "session", None) or {}
    session = dict(recorded) if recorded and not own else dict(preset_session(spec))
    session.update(own)
    own = session_options(session)
    out = session_options(own, overrides).wire()
    for key in ("intra_op_num_threads", "inter_op_num_threads"):
        if out[key] == 0:
            out[key] = own[key] or 1
    if getattr(spec, "kind", "") != "imported":  # an imported host runs nothing: its session is a record
        check_threads(spec.name, out, thread_limit(spec))
    return out


#: the thread ceiling of an ssh host, whose cores are known only once it answers
SSH_MAX_THREADS = 1024


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset), else the core count."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_limit(spec) -> int:
    """The most threads one session of host `spec` may start: the cores it runs on. A local or masked host runs on
    this machine's usable cores; an emulated device's threads run there too, and it may keep its own deployed count
    (a Pi 5's 4 on a 2-core machine); an ssh host's cores are not known before it answers (SSH_MAX_THREADS)."""
    if getattr(spec, "kind", "") == "ssh":
        return SSH_MAX_THREADS
    return max(usable_cores(), int(preset_session(spec).get("intra_op_num_threads") or 1))


def check_threads(host: str, session: dict, limit: int) -> None:
    """A thread count above `limit` is one UserError naming the host, the value and the limit: onnxruntime starts
    every thread it is asked for (100000 never finished, growing 40 MB/s), where more threads than cores only
    share them."""
    for key in ("intra_op_num_threads", "inter_op_num_threads"):
        if session[key] < 1:   # 0 was the host's own count by now; onnxruntime would take -1 as its default
            raise UserError(f"host {host}: {key}={session[key]}: must be at least 1 (0: the host's own count)")
        if session[key] > limit:
            raise UserError(f"host {host}: {key}={session[key]}: more than the {limit} cores it runs on; "
                            f"use at most {limit}")


def worker_threads(session: dict) -> int:
    """The cores one worker under `session` keeps busy: its intra-op threads (times the inter-op threads when
    nodes run in parallel). The scheduler hands a worker that many of its core slots."""
    n = max(1, int(session.get("intra_op_num_threads") or 1))
    if session.get("execution_mode") == "parallel":
        n *= max(1, int(session.get("inter_op_num_threads") or 1))
    return n


def describe(session: dict) -> str:
    """'XnnpackExecutionProvider > CPUExecutionProvider; 4 intra-op threads; graph opt all' (report, run table)."""
    s = normalize_session(session)
    parts = [" > ".join(s["providers"]), f"{s['intra_op_num_threads']} intra-op thread"
             + ("s" if s["intra_op_num_threads"] != 1 else "")]
    if s["execution_mode"] != "sequential":
        parts.append(f"{s['execution_mode']}, {s['inter_op_num_threads']} inter-op")
    parts.append(f"graph opt {s['graph_optimization_level']}")
    parts += [f"{k}={v}" for k, v in s["config_entries"].items()]
    return "; ".join(parts)
