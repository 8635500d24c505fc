"""Host start-up for the explain commands and the search: a host's worker opened under its own session, every
host's at once (one thread each: hosts are independent processes), none left running when one fails to start.

Hosts arrive as registry.HostRequest (label, spec, session): the one `--hosts` parser, registry.parse_hosts, reads
NAME+KEY=VALUE items for every command.
"""

from __future__ import annotations

import threading

from quantbench.hosts.registry import HostRequest
from quantbench.hosts.workerclient import WorkerClient


def open_worker(host: HostRequest, require_providers: bool = False):
    """A started, fingerprinted worker of `host` under its session (quantbench.hosts.workerclient.WorkerClient)."""
    return WorkerClient(host.spec, host.session, require_providers, label=host.label).open()


def start_workers(hosts: list[HostRequest], require_providers: bool = False) -> list:
    """Start (and fingerprint) every host's worker in parallel; close them all if one fails."""
    workers: list = [None] * len(hosts)

    def start(i):
        workers[i] = open_worker(hosts[i], require_providers)

    try:
        parallel(start, list(range(len(hosts))))
    except BaseException:
        for w in workers:
            if w is not None:
                w.close()
        raise
    return workers


def parallel(fn, items):
    """fn(item) for every item in its own thread (hosts are independent processes); results in order."""
    out: list = [None] * len(items)
    errors: list = []

    def go(i):
        try:
            out[i] = fn(items[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out

