"""The scheduler over worker slots: a freed slot goes where most work is left, first workers before extra ones, an
ssh host grows on its own cores over one connection, and workers keep to their variant's session."""

import pytest

from hosts_helpers import fixtures, matmul_model, variant
from quantbench.runs.runner import run_hosts
from quantbench.store import hostresults


class _FakeRun:
    def __init__(self, name, left, local=True, wants=True):
        import threading

        self.name, self.left, self.uses_local_slot, self.wants = name, left, local, wants
        self.lock = threading.Lock()
        self.starting = 0
        self.cores = 1  # core slots per worker (its threads): one-thread workers here
        self.granted = 0
        self.stop = threading.Event()

    def wants_worker(self):
        return self.wants and self.starting + self.granted < 3

    def work_left(self):
        return self.left / (1 + self.starting)

    def grant(self):
        self.granted += 1


def test_freed_slot_goes_to_the_host_with_most_work_left():
    from quantbench.runs.scheduling import Scheduler as _Scheduler

    s = _Scheduler(2)
    pi, x86, pi4 = _FakeRun("pi", 50.0), _FakeRun("x86", 0.5), _FakeRun("pi4", 20.0)
    s.runs = [pi, x86, pi4]
    assert s.first_slot(pi) and s.first_slot(x86)  # one slot each, nothing left over
    s.rebalance()
    assert (pi.starting, x86.starting, pi4.starting) == (0, 0, 0)
    s.release(x86)  # x86 finished: its slot goes to pi (most work left), which starts another worker
    assert (pi.starting, x86.starting, pi4.starting) == (1, 0, 0) and s.free == 0
    s.release(pi)  # next freed slot: pi now shares its work over two workers (25 s) and pi4 has 20 s
    assert (pi.starting, pi4.starting) == (2, 0)
    pi.starting = 0
    pi.left = 5.0
    s.release(pi)
    assert pi4.starting == 1


def test_first_workers_come_before_extra_ones_and_ssh_takes_no_local_slot():
    import threading

    from quantbench.runs.scheduling import Scheduler as _Scheduler

    s = _Scheduler(1)
    busy, late, remote = _FakeRun("pi", 100.0), _FakeRun("pi4", 1.0), _FakeRun("lab", 100.0, local=False)
    s.runs = [busy, late, remote]
    assert s.first_slot(busy)
    got = []
    t = threading.Thread(target=lambda: got.append(s.first_slot(late)))
    t.start()
    while not s.waiting:
        pass
    s.release(busy)  # pi4 is waiting for its first worker: the slot is its, not pi's extra worker
    t.join(5)
    assert got == [True] and busy.starting == 0
    assert remote.starting >= 1 and s.free == 0  # an ssh host grows on its own cores


def test_a_host_back_from_a_confirm_wait_takes_the_next_slot_before_hosts_not_started():
    import threading

    from quantbench.runs.scheduling import Scheduler as _Scheduler

    s = _Scheduler(1)
    busy, queued, back = _FakeRun("pi", 1.0), _FakeRun("pi4", 1.0), _FakeRun("x86-avx2", 1.0)
    s.runs = []   # no extra workers: only the first slots matter here
    assert s.first_slot(busy)
    order = []
    waiters = [threading.Thread(target=lambda r=r, f=f: s.first_slot(r, front=f) and order.append(r.name))
               for r, f in ((queued, False), (back, True))]
    waiters[0].start()
    while queued not in s.waiting:
        pass
    waiters[1].start()
    while back not in s.waiting:
        pass
    s.release(busy)                      # x86-avx2's worker is up already: the slot is its first
    while not order:
        pass
    assert order == ["x86-avx2"]
    s.release(back)
    for t in waiters:
        t.join(5)
    assert order == ["x86-avx2", "pi4"]


def test_a_freed_slot_starts_another_worker_for_the_busy_host(workdir, home, monkeypatch):
    """Two hosts, two slots: the quick host ends, and the slow host's second worker takes over half its work."""
    from hosts_helpers import slow_model
    from quantbench.runs.runner import _HostRun

    monkeypatch.setattr(_HostRun, "STARTUP_FACTOR", 0.0)  # any unclaimed work is worth a worker
    hf = workdir / "hosts.toml"
    hf.write_text('quick = { kind = "local" }\nbusy = { kind = "local" }\n')
    slow = slow_model(workdir / "slow.onnx", rows=1024, layers=48)
    quick = matmul_model(workdir / "m.onnx")
    # each host runs the variants whose input fits: give both a fixture of the slow model's input
    fxs = fixtures(24)
    from quantbench.runs import runner as R

    real_plan = R._HostRun._plan

    def plan(self, fid):  # the quick host runs one fixture, the busy one all of them
        work = real_plan(self, fid)
        if self.spec.name == "quick":
            work = [(vi, todo[:1]) for vi, todo in work[:1]]
            self.summary.planned = 1
        return work

    monkeypatch.setattr(R._HostRun, "_plan", plan)
    s = run_hosts(["quick", "busy"], [variant(slow, name="fp32", model="slow")], fxs, progress=False,
                  tables_root=workdir / "t", jobs=2, hosts_file=hf)
    q, b = s.hosts
    assert q.workers == 1 and b.workers == 2, (q, b)
    assert b.ran == 24 and not s.errors
    assert b.sessions_reused >= 1  # a worker's later jobs of the same variant reuse its session
    rows = hostresults.load_outputs(host="busy", tensors=False, tables_root=workdir / "t")
    assert sorted(set(rows.column("fixture_id").to_pylist())) == sorted(fx.fixture_id for fx in fxs)
    del quick


def test_one_slot_means_one_worker_at_a_time(workdir, home, monkeypatch):
    from hosts_helpers import slow_model
    from quantbench.runs.runner import _HostRun

    monkeypatch.setattr(_HostRun, "STARTUP_FACTOR", 0.0)
    slow = slow_model(workdir / "slow.onnx", layers=8)
    s = run_hosts(["x86"], [variant(slow)], fixtures(12), progress=False, tables_root=workdir / "t", jobs=1)
    assert s.hosts[0].workers == 1 and s.hosts[0].ran == 12


@pytest.mark.ssh
def test_ssh_host_grows_workers_over_one_connection(workdir, home, monkeypatch, sshd):
    """Several workers on an ssh host (the remote has the cores) share one connection (ControlMaster)."""
    from hosts_helpers import slow_model
    from quantbench.runs.runner import _HostRun
    from quantbench.hosts.ssh import SSHHost

    monkeypatch.setattr(_HostRun, "STARTUP_FACTOR", 0.0)
    argvs = []
    real = SSHHost.argv
    monkeypatch.setattr(SSHHost, "argv", lambda self: argvs.append(real(self)) or argvs[-1])
    slow = slow_model(workdir / "slow.onnx", rows=1024, layers=48)
    s = run_hosts(["robot"], [variant(slow)], fixtures(16), hosts_file=sshd, progress=False,
                  tables_root=workdir / "t", jobs=1)
    h = s.hosts[0]
    assert h.ran == 16 and not h.errors
    import os

    assert h.workers == min(2, os.cpu_count())  # the remote (this machine) has the cores; none are local slots
    assert all("ControlMaster=auto" in a for a in argvs) and len({a[a.index("ControlMaster=auto") + 2]
                                                                   for a in argvs}) == 1


def test_workers_stay_on_their_variant_and_start_on_different_ones():
    from types import SimpleNamespace

    from quantbench.runs.taskloop import Tasks

    t = Tasks()
    va, vb = SimpleNamespace(variant_id="A"), SimpleNamespace(variant_id="B")
    for v in (va, vb):
        for i in range(3):
            t.put(v, [f"{v.variant_id}{i}"] * 2)
    w1 = t.take(None)
    w2 = t.take(None)
    assert {w1[0].variant_id, w2[0].variant_id} == {"A", "B"}  # two workers, two sessions, not four
    assert t.take(w1[0].variant_id)[0] is w1[0]  # a worker keeps to the variant whose session it holds
    assert t.take(w1[0].variant_id)[0] is w1[0]
    # its variant exhausted, it joins the other one (the only work left)
    assert t.take(w1[0].variant_id)[0] is w2[0]
    assert t.qsize() == 1
    assert t.take(w2[0].variant_id)[0] is w2[0] and t.take(w2[0].variant_id) is None and t.qsize() == 0
