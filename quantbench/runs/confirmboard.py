"""equiv's confirm inside one run: the hosts' fresh fingerprints, who is predicted to share whose class, and the
verdict on each predicted host's confirming fixtures, shared by the hosts' threads of a run.

A host that runs workers registers the fingerprint its first worker reported (or the remembered one it adopted
when it has nothing to start): the prediction never reads a remembered fingerprint before the run, so the same
command writes the same rows on a machine that has fingerprinted nothing. A host waits (its slot given back)
until every host named before it has registered, then learns its anchors (`predict`, given by the caller:
api.confirm); it runs the confirming fixtures first, waits for its anchors' outputs of them, and runs the rest of
a variant only where any differs. Hosts that run no workers (imported, cluster) register nothing and anchor none.
"""

from __future__ import annotations

import threading


class ConfirmBoard:
    """`order`: the hosts, the reference first; `first`: variant_id -> the confirming fixture ids; `predict`:
    (hosts, {host: info or None}) -> {variant_id: {host: anchor}} (analysis.confirm.predicted_anchors);
    `info`: (fingerprint, session) -> what `predict` reads of a host."""

    def __init__(self, order: list, first: dict, predict, info):
        self.order, self.first, self.predict, self.info = list(order), first, predict, info
        self.cond = threading.Condition()
        self.infos: dict = {}       # host -> info (None: no prediction for or from it)
        self.ended: set = set()
        self.settled: set = set()   # hosts whose own confirming fixtures all ran (their workers joined)
        self.seen: dict = {}        # (host, variant_id, fixture_id) -> sorted (output, sha256)
        self.anchors: dict = {}     # host -> {variant_id: anchor}
        self.verdicts: dict = {}    # (host, variant_id) -> True: confirmed, False: a miss
        self.halted = False         # the run is interrupted: no wait goes on

    def register(self, host: str, fingerprint: dict | None, session: dict | None) -> None:
        """`host`'s fingerprint this run (None: it predicts nothing and anchors nothing)."""
        info = None if fingerprint is None else self.info(fingerprint, session)
        with self.cond:
            self.infos.setdefault(host, info)
            self.cond.notify_all()

    def end(self, host: str) -> None:
        """`host` ran everything it will run (or failed): nobody waits for its outputs any more."""
        with self.cond:
            self.infos.setdefault(host, None)
            self.ended.add(host)
            self.cond.notify_all()

    def settle(self, host: str) -> None:
        """`host` ran every confirming fixture it will run (its workers joined): one still missing never comes."""
        with self.cond:
            self.settled.add(host)
            self.cond.notify_all()

    def halt(self) -> None:
        """The run is interrupted: every wait ends now (a host learns no anchor, confirms nothing)."""
        with self.cond:
            self.halted = True
            self.cond.notify_all()

    def saw(self, rows: list[dict]) -> None:
        """Outputs rows of one finished fixture (resultrows.HostRows, or the tables' rows of a cached one)."""
        per: dict = {}
        for r in rows:
            per.setdefault((r["host"], r["variant_id"], r["fixture_id"]), []).append((r["output_name"], r["sha256"]))
        with self.cond:
            for key, outs in per.items():
                self.seen[key] = sorted(outs)
            self.cond.notify_all()

    def _before_known(self, host: str) -> bool:
        before = self.order[:self.order.index(host)] if host in self.order else []
        return self.halted or all(h in self.infos for h in before)

    def anchors_of(self, host: str, pause=None, resume=None) -> dict:
        """{variant_id: anchor} of `host`, once every host named before it registered; `pause`/`resume`: what the
        host does around a wait (gives its slot back, takes one again)."""
        with self.cond:
            if not self._before_known(host):
                if pause is not None:
                    pause()
                while not self._before_known(host):
                    self.cond.wait(0.5)
                waited = True
            else:
                waited = False
            hosts = self.order[:self.order.index(host) + 1] if host in self.order else []
            got = self.predict(hosts, {h: self.infos.get(h) for h in hosts}) if hosts else {}
            self.anchors[host] = {v: a[host] for v, a in got.items() if host in a}
        if waited and resume is not None:
            resume()
        return self.anchors[host]

    def _decided(self, host: str, vid: str, anchor: str) -> bool | None:
        """True/False once every confirming fixture of both is seen; False when one of them ended (or the run
        halted) without its own (a missing one is no confirmation); None while waiting. Each side is judged by its
        own end: an anchor that finished does not cut short the host's fixtures still on its other workers."""
        fids = self.first.get(vid, [])
        mine = [self.seen.get((host, vid, f)) for f in fids]
        theirs = [self.seen.get((anchor, vid, f)) for f in fids]
        mine_in, theirs_in = all(m is not None for m in mine), all(t is not None for t in theirs)
        if mine_in and theirs_in:
            return mine == theirs
        anchor_gone = not theirs_in and anchor in self.ended
        mine_gone = not mine_in and (host in self.ended or host in self.settled)
        return False if self.halted or anchor_gone or mine_gone else None

    def verdicts_of(self, host: str, pause=None, resume=None) -> dict:
        """{variant_id: confirmed} for each variant `host` was predicted on, once its anchor's confirming outputs
        are in (`pause`/`resume` as anchors_of)."""
        pending = dict(self.anchors.get(host, {}))
        waited = False
        with self.cond:
            while True:
                for vid, anchor in list(pending.items()):
                    got = self._decided(host, vid, anchor)
                    if got is not None:
                        self.verdicts[(host, vid)] = got
                        del pending[vid]
                if not pending:
                    break
                if not waited and pause is not None:
                    pause()
                waited = True
                self.cond.wait(0.5)
        if waited and resume is not None:
            resume()
        return {vid: self.verdicts[(host, vid)] for vid in self.anchors.get(host, {})}

    def outcome(self) -> tuple[dict, list]:
        """({(host, variant_id): anchor} confirmed, [{host, variant_id, anchor}] misses), after the run."""
        inherited, misses = {}, []
        for (host, vid), ok in sorted(self.verdicts.items()):
            anchor = self.anchors[host][vid]
            if ok:
                inherited[(host, vid)] = anchor
            else:
                misses.append({"host": host, "variant_id": vid, "anchor": anchor})
        return inherited, misses
