"""equiv's confirm inside one run (runs.confirmboard): a host learns its anchors only once every host named before
it has a fingerprint in this run (giving its slot back while it waits), and a predicted host is confirmed only when
every confirming fixture is byte-identical to its anchor's; an anchor that ended without one is no confirmation."""

from __future__ import annotations

import threading

from quantbench.runs.confirmboard import ConfirmBoard

FIRST = {"v": ["f1", "f2"]}


def _same_flags(hosts, infos):
    """Each host joins the first one before it with the same flags (what analysis.confirm.predicted_anchors does
    from the kernels those flags select)."""
    first, out = {}, {}
    for h in hosts:
        if infos[h] is None:
            continue
        key = infos[h]["flags"]
        if key in first:
            out[h] = first[key]
        else:
            first[key] = h
    return {"v": out}


def _board(order):
    return ConfirmBoard(order, FIRST, _same_flags, lambda fp, session: {"flags": fp["flags"]})


def _anchored():
    """a and b with the same flags, b predicted on a (its anchor learnt)."""
    board = _board(["a", "b"])
    board.register("a", {"flags": "avx2"}, None)
    board.register("b", {"flags": "avx2"}, None)
    assert board.anchors_of("b") == {"v": "a"}
    return board


def _rows(host, fixture, sha="s"):
    return [{"host": host, "variant_id": "v", "fixture_id": fixture, "output_name": o, "sha256": f"{sha}{o}"}
            for o in ("out", "aux")]


def test_a_host_learns_its_anchor_only_once_the_hosts_before_it_have_fingerprints():
    board = _board(["a", "b"])
    paused, got = threading.Event(), {}
    waiter = threading.Thread(target=lambda: got.update(board.anchors_of("b", pause=paused.set)))
    waiter.start()
    assert paused.wait(30)              # b gave its slot back: a may need it to start
    board.register("b", {"flags": "avx2"}, None)
    assert waiter.is_alive()            # a's fingerprint is still unknown
    board.register("a", {"flags": "avx2"}, None)
    waiter.join(30)
    assert got == {"v": "a"}
    assert board.anchors_of("a") == {}  # the first named anchors, it is never predicted


def test_confirmed_only_when_every_confirming_fixture_is_byte_identical():
    board = _board(["a", "b", "c"])
    for h in ("a", "b", "c"):
        board.register(h, {"flags": "avx2"}, None)
        board.anchors_of(h)
    for f in FIRST["v"]:
        board.saw(_rows("a", f) + _rows("b", f) + _rows("c", f, sha="s" if f == "f1" else "other"))
    assert board.verdicts_of("b") == {"v": True} and board.verdicts_of("c") == {"v": False}
    inherited, misses = board.outcome()
    assert inherited == {("b", "v"): "a"} and misses == [{"host": "c", "variant_id": "v", "anchor": "a"}]


def test_an_anchor_that_ended_without_a_confirming_fixture_confirms_nothing():
    board = _anchored()
    board.saw(_rows("a", "f1") + _rows("b", "f1") + _rows("b", "f2"))
    board.end("a")                      # a failed before f2
    assert board.verdicts_of("b") == {"v": False}


def test_an_anchor_that_ended_with_every_confirming_fixture_waits_for_the_hosts_own():
    """The anchor finished (all its confirming outputs in) while one of the host's own confirming fixtures is still
    running on its second worker: the verdict waits for it (it was a prediction miss of identical bytes)."""
    board = _anchored()
    board.saw(_rows("a", "f1") + _rows("a", "f2") + _rows("b", "f1"))
    board.end("a")
    got, paused = {}, threading.Event()
    waiter = threading.Thread(target=lambda: got.update(board.verdicts_of("b", pause=paused.set)))
    waiter.start()
    assert paused.wait(30), "b's verdict did not wait for its own f2"
    board.saw(_rows("b", "f2"))         # b's second worker delivers f2
    waiter.join(30)
    assert got == {"v": True}


def test_a_host_whose_workers_joined_without_its_confirming_fixture_confirms_nothing():
    board = _anchored()
    board.saw(_rows("a", "f1") + _rows("a", "f2") + _rows("b", "f1"))
    board.settle("b")                   # its workers joined: f2 (a runtime that cannot run it) never comes
    assert board.verdicts_of("b") == {"v": False}


def test_a_host_without_workers_anchors_nobody():
    board = _board(["imported", "b"])
    board.end("imported")
    board.register("b", {"flags": "avx2"}, None)
    assert board.anchors_of("b") == {}


def test_an_interrupted_run_ends_every_wait():
    board = _board(["a", "b"])
    got = {}
    waiter = threading.Thread(target=lambda: got.update(board.anchors_of("b")))
    waiter.start()
    board.halt()                        # Ctrl-C: a never registers
    waiter.join(30)
    assert not waiter.is_alive() and got == {}
