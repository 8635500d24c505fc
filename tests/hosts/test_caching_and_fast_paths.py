"""Speed work, asserted by behaviour (counts of worker starts, serialisations, decodes), never by timing."""

import os
import numpy as np
import pytest

from hosts_helpers import fixtures, make_corpus, matmul_model, variant
from quantbench import fsutil, tensorcode
from quantbench.report import charts
from quantbench.store import compaction, partread, partwrite, resultpaths
from quantbench.hosts import fingerprintcache
from quantbench.store import hostresults
from quantbench.hosts.keys import normalize_session
from quantbench.hosts.registry import HostSpec, make_host
from quantbench.hosts.runner import run_hosts
from ssh_helpers import sshd  # noqa: F401  (the sshd fixture)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("QUANTBENCH_FINGERPRINT_CACHE", raising=False)
    return tmp_path / "home"


def _count_starts(monkeypatch):
    from quantbench.hosts.process import ProcessHost

    starts = []
    real = ProcessHost.start

    def start(self):
        starts.append(self.name)
        return real(self)

    monkeypatch.setattr(ProcessHost, "start", start)
    return starts


def test_cached_rerun_starts_no_worker(workdir, home, monkeypatch):
    model = matmul_model(workdir / "m.onnx")
    root = workdir / "t"
    starts = _count_starts(monkeypatch)
    first = run_hosts(["x86"], [variant(model)], fixtures(4), progress=False, tables_root=root, jobs=1).hosts[0]
    assert (first.ran, first.workers, first.fingerprint_cached) == (4, 1, False)
    assert starts == ["x86"]
    parts = {n: partread.parts(n, root) for n in ("outputs", "hosts", "models", "fixtures")}
    again = run_hosts(["x86"], [variant(model)], fixtures(4), progress=False, tables_root=root, jobs=1).hosts[0]
    assert (again.ran, again.cached, again.workers, again.fingerprint_cached) == (0, 4, 0, True)
    assert again.fingerprint_id == first.fingerprint_id
    assert starts == ["x86"]  # no process started at all
    assert {n: partread.parts(n, root) for n in parts} == parts  # and nothing written
    # work left: a worker starts, is fingerprinted for real, and runs only the new fixture
    more = run_hosts(["x86"], [variant(model)], fixtures(5), progress=False, tables_root=root, jobs=1).hosts[0]
    assert (more.ran, more.cached, more.workers, more.fingerprint_id) == (1, 4, 1, first.fingerprint_id)
    # other session options: another key, so the host is asked again
    opt = run_hosts(["x86"], [variant(model)], fixtures(4), progress=False, tables_root=root, jobs=1,
                    session={"config_entries": {"session.x64quantprecision": "1"}}).hosts[0]
    assert (opt.ran, opt.workers) == (4, 1) and opt.fingerprint_id != first.fingerprint_id
    assert len(starts) == 3


def test_fingerprint_cache_off_and_keys(workdir, home, monkeypatch):
    sess = normalize_session(None)
    x86 = make_host(HostSpec("x86", "local", {}))
    key = fingerprintcache.cache_key(x86, sess, False)
    assert key and key == fingerprintcache.cache_key(x86, sess, False)
    assert fingerprintcache.cache_key(x86, normalize_session({"graph_optimization_level": "basic"}), False) != key
    assert fingerprintcache.cache_key(x86, sess, True) != key
    # a value unlike the machine's own (some machines here set OPENBLAS_CORETYPE=Haswell already)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Nehalem" if os.environ.get("OPENBLAS_CORETYPE") == "Haswell" else "Haswell")
    assert fingerprintcache.cache_key(x86, sess, False) != key
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    # interpreters we do not inspect and remote machines are always asked
    assert fingerprintcache.cache_key(make_host(HostSpec("x86", "local", {"python": "/usr/bin/python3"})), sess, False) is None
    assert fingerprintcache.cache_key(make_host(HostSpec("lab", "ssh", {"address": "pi@lab"})), sess, False) is None
    # a damaged entry is a miss
    (fingerprintcache.cache_dir()).mkdir(parents=True)
    (fingerprintcache.cache_dir() / f"{key}.json").write_text('{"fingerprint": {"identity": {}}, "fingerprint_id": "0"}')
    assert fingerprintcache.lookup(key) is None
    monkeypatch.setenv("QUANTBENCH_FINGERPRINT_CACHE", "0")
    assert fingerprintcache.cache_key(x86, sess, False) is None
    model = matmul_model(workdir / "m.onnx")
    starts = _count_starts(monkeypatch)
    for _ in range(2):
        run_hosts(["x86"], [variant(model)], fixtures(2), progress=False, tables_root=workdir / "t", jobs=1)
    assert starts == ["x86", "x86"]


def _worker_code() -> str:
    """tensorcode.py's and worker.py's sources, each hashed, hashed together (what a worker runs)."""
    import hashlib
    from pathlib import Path

    from quantbench.hosts import worker as W

    h = hashlib.sha256()
    for p in (Path(W.__file__).resolve().parents[1] / "tensorcode.py", Path(W.__file__).resolve()):
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _version2_key(host, session, require_providers):
    """The version-2 key as users' caches hold it, spelled out: any change to its material must bump
    fingerprintcache.VERSION (or every existing cache entry silently stops matching)."""
    import hashlib
    import os
    import sys
    from pathlib import Path

    from quantbench.fsutil import canonical_json
    from quantbench.hosts import emulated as em

    argv, env, preamble = host.command()
    env = env if env is not None else dict(os.environ)
    parts = {
        "version": 2, "kind": host.kind, "name": host.name, "options": canonical_json(host.options),
        "worker": _worker_code(), "session": session,
        "require_providers": bool(require_providers), "argv": list(argv),
        "preamble": hashlib.sha256(preamble or b"").hexdigest(),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(fingerprintcache._ENV_PREFIXES)},
        "files": [fingerprintcache._stat(a) for a in argv if os.path.sep in a and os.path.exists(a)],
        "local_cpu": fingerprintcache._local_cpu(), "local_python": [sys.version, fingerprintcache._stat(sys.executable)],
        "packages": [fingerprintcache._package_stats("onnxruntime"), fingerprintcache._package_stats("numpy")],
    }
    if host.kind == "emulated":
        def text(p):
            return Path(p).read_text(errors="replace") if Path(p).exists() else ""

        name = host.options.get("preset", host.name)
        site = str(env.get("PYTHONPATH", ""))
        parts["emulated"] = {
            "preset": repr(em.PRESETS.get(name)), "cpuinfo": text(em.prefix_dir(name) / "proc" / "cpuinfo"),
            "prefix_stamp": text(em.prefix_stamp(name)), "root_stamp": text(em.root_stamp()), "site": site,
            "site_stamps": [text(Path(p).parent / f"{Path(p).name}.json") for p in site.split(os.pathsep) if p],
        }
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


def test_fingerprint_cache_keys_keep_their_version_2_material(monkeypatch):
    """Each host kind supplies its own key material; the keys of local and emulated hosts are the spelled-out
    version-2 material (version 2: the worker's code is tensorcode.py and worker.py), so a change to it must
    bump fingerprintcache.VERSION (the real ~/.cache home: the preset's own files)."""
    from quantbench.hosts import emulated as em
    from setup_required import missing_setup

    monkeypatch.delenv("QUANTBENCH_FINGERPRINT_CACHE", raising=False)
    assert fingerprintcache.VERSION == 2
    sess = normalize_session(None)
    hosts = [HostSpec("x86", "local", {})]
    for name in ("pi", "x86-avx2"):
        ok, msg = em.ready(name)
        if not ok:
            missing_setup(f"{name} not set up: {msg}")
        hosts.append(HostSpec(name, "emulated", {"preset": name}))
    hosts.append(HostSpec("lab", "emulated", {"preset": "pi4", "qemu_args": ["-d", "nochain"]}))
    if not em.ready("pi4")[0]:
        hosts.pop()
    for spec in hosts:
        host = make_host(spec)
        for fallback in (False, True):
            assert fingerprintcache.cache_key(host, sess, fallback) == _version2_key(host, sess, fallback), spec


def test_ledger_skips_serialising_stored_rows(tmp_path, monkeypatch):
    rows = [{"variant_id": f"v{i}", "raw_sha256": "r", "model": "m", "variant": "fp32", "path": "p", "recipe": "{}"}
            for i in range(3)]
    p1 = partwrite.append("models", rows, root=tmp_path, ledger=True)
    calls = []
    real = partwrite.serialize
    monkeypatch.setattr(partwrite, "serialize", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert partwrite.append("models", rows, root=tmp_path, ledger=True) == p1
    assert calls == []
    p2 = partwrite.append("models", rows[:2], root=tmp_path, ledger=True)  # other rows: written
    assert calls == [1] and p2 != p1
    p1.unlink()  # the part went away (e.g. compacted and lost): written again
    assert partwrite.append("models", rows, root=tmp_path, ledger=True) == p1 and p1.exists()
    assert partread.read("models", tmp_path).num_rows == 3


def test_fixture_tensors_decoded_once(workdir, home, monkeypatch):
    from quantbench.inputs import fixtures as F

    labels = make_corpus(workdir / "corpus", count=3, size=8)
    spec = {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32",
            "scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}
    first = F.build_fixtures(spec, labels, split=None)
    monkeypatch.setattr(F, "load_rgb", lambda path: pytest.fail(f"decoded {path} again"))
    again = F.build_fixtures(spec, labels, split=None)
    assert [f.fixture_id for f in again] == [f.fixture_id for f in first]
    assert all(np.array_equal(a.array, b.array) and a.array.dtype == b.array.dtype for a, b in zip(first, again))
    other = dict(spec, mean=[0.0, 0.0, 0.0])  # another recipe: decoded again
    monkeypatch.undo()
    monkeypatch.setenv("QUANTBENCH_HOME", str(home))
    assert {f.fixture_id for f in F.build_fixtures(other, labels, split=None)}.isdisjoint(f.fixture_id for f in first)


def test_plots_not_redrawn_for_the_same_data(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace


    result = SimpleNamespace(hosts={"pi": {}, "x86": {}}, flip_rows=[],
                             variants=[{"model": "m", "variant": "fp32",
                                        "classes": [{"label": "A", "hosts": ["pi", "x86"]}]}])
    path = tmp_path / "plots" / "classes.png"
    assert charts.plot_class_map(result, path) == path
    drawn = []
    monkeypatch.setattr(charts, "_savefig", lambda fig, p, key=None: drawn.append(p) or p)
    assert charts.plot_class_map(result, path) == path and drawn == []
    result.variants[0]["classes"] = [{"label": "A", "hosts": ["pi"]}, {"label": "B", "hosts": ["x86"]}]
    charts.plot_class_map(result, path)
    assert drawn == [path]


def _outputs_rows(n_parts, per_part, seed=0):
    rs = np.random.RandomState(seed)
    out = []
    for p in range(n_parts):
        rows = []
        for i in range(per_part):
            k = p * per_part + i
            t = rs.rand(4).astype("<f4")
            rows.append({"run_key": f"rk{k:05d}", "host": ["pi", "x86", "pi4"][k % 3], "fingerprint_id": f"fp{k % 3}",
                         "session_key": "s", "session_options": "{}", "variant_id": f"v{k % 2}", "variant": "fp32",
                         "fixture_id": f"f{k // 6:04d}", "output_name": "y", "dtype": "<f4", "shape": [4],
                         "sha256": f"h{k}", "tensor": t.tobytes(), "providers": ["CPUExecutionProvider"]})
        out.append(rows)
    return out


def test_compaction_keeps_rows_and_keys(tmp_path, capsys):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = tmp_path / "t"
    batches = _outputs_rows(30, 7)
    for rows in batches:
        partwrite.append("outputs", rows, root=root)
    partwrite.append("outputs", batches[3], root=root)  # a duplicate part (same rows): readers keep one copy
    partwrite.append("models", [{"variant_id": "v0", "raw_sha256": "r", "model": "m", "variant": "fp32", "path": "p",
                              "recipe": "{}"}], root=root, ledger=True)
    before = partread.read("outputs", root)
    flt = (pc.field("host") == "pi") & pc.field("variant_id").isin(["v1"])
    sliced = partread.read("outputs", root, filter=flt)
    assert len(partread.parts("outputs", root)) == 30
    from quantbench.cli import main

    assert main(["tables", "--tables", str(root), "compact"]) == 0
    assert "outputs: 30 parts -> 1 (210 rows)" in capsys.readouterr().out
    after_parts = partread.parts("outputs", root)
    assert len(after_parts) == 1
    assert partread.read("outputs", root).equals(before)  # same rows, same keys, same order
    assert partread.read("outputs", root, filter=flt).equals(sliced)
    # sorted by the columns reads filter on, with statistics on them, in several row groups
    meta = pq.ParquetFile(after_parts[0]).metadata
    assert meta.num_row_groups >= 1
    col = meta.schema.to_arrow_schema().get_field_index("host")
    assert meta.row_group(0).column(col).statistics.has_min_max
    hosts = pq.read_table(after_parts[0], columns=["host"]).column("host").to_pylist()
    assert hosts == sorted(hosts)
    # content-addressed: the part is named by its bytes, compacting again changes nothing
    assert after_parts[0].name == f"part-{fsutil.sha256_bytes(after_parts[0].read_bytes())[:32]}.parquet"
    assert compaction.compact("outputs", root)["parts_in"] == 0


def test_automatic_compaction_above_threshold(tmp_path, monkeypatch):
    root = tmp_path / "t"
    batches = _outputs_rows(12, 3)
    for rows in batches[:10]:
        partwrite.append("outputs", rows, root=root)
    assert compaction.maybe_compact("outputs", root, threshold=10) is None  # at the threshold: left alone
    partwrite.append("outputs", batches[10], root=root)
    r = compaction.maybe_compact("outputs", root, threshold=10)
    assert r["parts_in"] == 11 and len(partread.parts("outputs", root)) == 1
    monkeypatch.setenv("QUANTBENCH_COMPACT_PARTS", "0")
    partwrite.append("outputs", batches[11], root=root)
    assert compaction.maybe_compact("outputs", root) is None
    assert partread.read("outputs", root).num_rows == 36


def test_ledger_follows_compacted_rows(tmp_path, monkeypatch):
    root = tmp_path / "t"
    sets = [[{"variant_id": f"v{i}{j}", "raw_sha256": "r", "model": "m", "variant": "fp32", "path": "p",
              "recipe": "{}"} for j in range(2)] for i in range(3)]
    for rows in sets:
        partwrite.append("models", rows, root=root, ledger=True)
    compaction.compact("models", root)
    (only,) = partread.parts("models", root)
    calls = []
    real = partwrite.serialize
    monkeypatch.setattr(partwrite, "serialize", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert all(partwrite.append("models", rows, root=root, ledger=True) == only for rows in sets)
    assert calls == []


def test_read_restarts_when_a_part_vanishes(tmp_path, monkeypatch):
    root = tmp_path / "t"
    for rows in _outputs_rows(3, 2):
        partwrite.append("outputs", rows, root=root)
    real = partread.parts
    seen = []

    def parts(name, r=resultpaths.TABLES_DIR):
        got = real(name, r)
        if not seen:  # the first listing names a part that a compaction has just removed
            seen.append(1)
            return got + [got[0].parent / "part-gone.parquet"]
        return got

    monkeypatch.setattr(partread, "parts", parts)
    assert partread.read("outputs", root).num_rows == 6


# --------------------------------------------------------------------------- scheduler


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
    from quantbench.hosts.runner import _Scheduler

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

    from quantbench.hosts.runner import _Scheduler

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


def test_a_freed_slot_starts_another_worker_for_the_busy_host(workdir, home, monkeypatch):
    """Two hosts, two slots: the quick host ends, and the slow host's second worker takes over half its work."""
    from hosts_helpers import slow_model
    from quantbench.hosts.runner import _HostRun

    monkeypatch.setattr(_HostRun, "STARTUP_FACTOR", 0.0)  # any unclaimed work is worth a worker
    hf = workdir / "hosts.toml"
    hf.write_text('quick = { kind = "local" }\nbusy = { kind = "local" }\n')
    slow = slow_model(workdir / "slow.onnx", rows=1024, layers=48)
    quick = matmul_model(workdir / "m.onnx")
    # each host runs the variants whose input fits: give both a fixture of the slow model's input
    fxs = fixtures(24)
    from quantbench.hosts import runner as R

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
    from quantbench.hosts.runner import _HostRun

    monkeypatch.setattr(_HostRun, "STARTUP_FACTOR", 0.0)
    slow = slow_model(workdir / "slow.onnx", layers=8)
    s = run_hosts(["x86"], [variant(slow)], fixtures(12), progress=False, tables_root=workdir / "t", jobs=1)
    assert s.hosts[0].workers == 1 and s.hosts[0].ran == 12


def test_worker_reuses_a_session_for_the_same_model_and_options(tmp_path):
    import io

    from quantbench.hosts import worker as W

    W._SESSIONS.clear()
    model = matmul_model(tmp_path / "m.onnx")
    a = np.ones((1, 16), np.float32)

    def job(session):
        raw = tensorcode.tensor_bytes(a)
        return {"type": "run", "host": "h", "variant": "v", "model": {"path": str(model)}, "session": session,
                "fixtures": [{"fixture_id": tensorcode.tensor_sha256(a), "input_name": "x", "dtype": "<f4", "shape": [1, 16],
                              "offset": 0, "nbytes": len(raw)}]}, [raw]

    inp = io.BytesIO()
    for sess in ({}, {}, {"graph_optimization_level": "basic"}, {}):  # same, same, other options, first again
        W.write_frame(inp, *job(sess))
    inp.seek(0)
    out = io.BytesIO()
    W.serve(inp, out)
    out.seek(0)
    frames = []
    while (f := W.read_frame(out)) is not None:
        frames.append(f[0])
    reused = [f["reused"] for f in frames if f["type"] == "session"]
    assert reused == [False, True, False, False]  # one session kept at a time
    results_ = [f for f in frames if f["type"] == "result"]
    assert len({tuple(o["sha256"] for o in f["outputs"]) for f in results_}) == 1


@pytest.mark.ssh
def test_ssh_host_grows_workers_over_one_connection(workdir, home, monkeypatch, sshd):
    """Several workers on an ssh host (the remote has the cores) share one connection (ControlMaster)."""
    from hosts_helpers import slow_model
    from quantbench.hosts.runner import _HostRun
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

    from quantbench.hosts.taskloop import Tasks

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


def test_tensor_cache_is_bounded(workdir, home, monkeypatch):
    from quantbench.inputs import fixtures as F

    labels = make_corpus(workdir / "corpus", count=4, size=8)
    spec = {"name": "images", "shape": [1, 3, 8, 8], "layout": "NCHW", "color": "RGB", "dtype": "float32",
            "scale": 1 / 255, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}
    monkeypatch.setenv("QUANTBENCH_TENSOR_CACHE_MB", str(2.5 * 896 / (1 << 20)))  # room for two 8x8x3 tensors
    F.build_fixtures(spec, labels, split=None)
    kept = list((home / "tensors").rglob("*.npy"))
    assert len(kept) == 2


def test_mapping_filters_read_what_expressions_read(tmp_path, monkeypatch):
    """A {column: values} filter (read part by part, row groups pruned by their statistics) keeps exactly the
    rows an expression filter (one dataset) keeps: on many parts with duplicates, and on compacted parts of
    many row groups, filtering columns that sit after a list column (whose leaves shift the column indices)."""
    import pyarrow.compute as pc

    root = tmp_path / "t"
    batches = _outputs_rows(12, 9)
    for rows in batches:
        partwrite.append("outputs", rows, root=root)
    partwrite.append("outputs", [dict(r, sha256="other") for r in batches[2]], root=root)  # same keys, later part
    cases = [({"host": "pi"}, pc.field("host") == "pi"),
             ({"host": ["pi", "pi4"], "variant_id": "v1"},
              pc.field("host").isin(["pi", "pi4"]) & (pc.field("variant_id") == "v1")),
             ({"sha256": ["h7", "h50", "h99", "other"]}, pc.field("sha256").isin(["h7", "h50", "h99", "other"])),
             ({"fixture_id": "f0003", "output_name": "y"}, (pc.field("fixture_id") == "f0003")
              & (pc.field("output_name") == "y")),
             ({"host": "nowhere"}, pc.field("host") == "nowhere")]

    def check():
        for where, expr in cases:
            got = partread.read("outputs", root, filter=where)
            assert got.equals(partread.read("outputs", root, filter=expr)), where
        assert partread.read("outputs", root, filter={}).equals(partread.read("outputs", root))

    check()
    monkeypatch.setitem(compaction.ROW_GROUP_ROWS, "outputs", 8)
    compaction.compact("outputs", root)
    assert partread._part_footer(partread.parts("outputs", root)[0])[0].num_row_groups > 10
    check()
    # fixtures: `objects` (a list of structs) has two leaf columns, so the ones after it shift by one
    for p in range(3):
        partwrite.append("fixtures", [{"fixture_id": f"f{p}{i}", "input_name": "x", "dtype": "<f4", "shape": [1],
                                    "source": f"s{i}", "image_sha256": "i", "labels": "[]",
                                    "objects": [{"category_id": i, "bbox": [0.0, 1.0, 2.0, 3.0]}],
                                    "stratum": f"st{(p * 7 + i) % 5}", "split": ["train", "val", "eval"][i % 3],
                                    "preprocess": "{}",
                                    "tensor": b"\0\0\0\0"} for i in range(6)], root=root)
    monkeypatch.setitem(compaction.ROW_GROUP_ROWS, "fixtures", 2)
    compaction.compact("fixtures", root)
    for col, v in (("stratum", "st0"), ("stratum", ["st1", "st4"]), ("split", "val"), ("split", ["eval", "train"])):
        want = pc.field(col).isin(v if isinstance(v, list) else [v])
        got = partread.read("fixtures", root, filter={col: v})
        assert got.num_rows and got.equals(partread.read("fixtures", root, filter=want)), (col, v)


def test_mapping_filter_read_loads_neither_dataset_nor_pandas(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "t"
    for rows in _outputs_rows(6, 4):
        partwrite.append("outputs", rows, root=root)
    code = ("import sys\nfrom quantbench.store import partread\n"
            f"t = partread.read('outputs', {str(root)!r}, columns=['run_key'], filter={{'host': ['pi', 'x86']}})\n"
            "u = partread.read('outputs', " + repr(str(root)) + ")\n"
            "print(t.num_rows, u.num_rows, sorted(m for m in ('pandas', 'pyarrow.dataset', 'pyarrow.acero') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["16", "24", "[]"]


def test_equiv_on_the_demo_loads_no_pandas_fresh_or_cached(workdir):
    """pyarrow imports pandas (~0.2 s) the first time it converts Python values (pa.array, Table.from_pylist); the
    tables lay every value they write into Arrow buffers and read an empty table without one (arrowrows.arrow_array), so
    neither a fresh equiv on the demo nor the cached one after it loads pandas (each its own process)."""
    import subprocess
    import sys

    from quantbench.cli import main

    vdir = workdir / "variants"
    assert main(["calibrate", "--out", str(vdir), "--methods", "dynamic", "--no-progress", "-q"]) == 0
    code = "import sys\nfrom quantbench.cli import main\nrc = main(sys.argv[1:])\nprint(rc, 'pandas' in sys.modules)"
    argv = ["equiv", "--hosts", "x86", "--variants", str(vdir), "--results", str(workdir / "r"), "--no-progress"]
    for run in ("fresh", "cached"):
        p = subprocess.run([sys.executable, "-c", code, *argv], cwd=workdir, capture_output=True, text=True)
        assert p.stdout.split()[-2:] == ["0", "False"], (run, p.stdout[-300:], p.stderr[-2000:])
        assert ("runs: x86 0 ran," in p.stdout) == (run == "cached"), p.stdout[:300]



def _cached_equiv_reads(workdir, capsys, monkeypatch) -> list:
    """(table, columns) of every tables.read of a second `equiv` on the bundled demo models (bare models with their
    sidecars beside them), after a first one; the report must come out the same."""
    from quantbench.cli import main

    argv = ["equiv", "--hosts", "x86", "--limit", "1", "--no-progress", "--no-plots"]
    assert main(argv) == 0, capsys.readouterr().err
    first = (workdir / "results" / "report.md").read_bytes()
    reads = []
    real = partread.read
    monkeypatch.setattr(partread, "read", lambda name, *a, **k: reads.append((name, tuple(k.get("columns") or ())))
                        or real(name, *a, **k))
    assert main(argv) == 0, capsys.readouterr().err
    assert "runs: x86 0 ran," in capsys.readouterr().out
    assert (workdir / "results" / "report.md").read_bytes() == first
    return reads


def test_a_cached_equiv_of_models_with_sidecars_reuses_the_analysis(workdir, capsys, monkeypatch):
    """A sidecar's checked input block (recipe.CheckedInput, a dict subclass) kept in the result made the analysis
    cache refuse to save it (a JSON round trip gives a plain dict), so every rerun on a bare model with a sidecar
    recomputed the analysis, its tensors read again; the result holds the sidecar as plain data now."""
    reads = _cached_equiv_reads(workdir, capsys, monkeypatch)
    assert not [cols for name, cols in reads if name == "outputs" and "tensor" in cols]


def test_a_cached_equiv_reads_the_outputs_hashes_and_placements_once(workdir, capsys, monkeypatch):
    """The analysis reads the outputs rows of its hosts and variants once: hashes (classes, selection) and the
    placements and session options (resolved providers) come from one read, not one read each."""
    reads = _cached_equiv_reads(workdir, capsys, monkeypatch)
    hashes = [cols for name, cols in reads if name == "outputs" and "sha256" in cols]
    assert len(hashes) == 1 and {"placement", "session_options"} <= set(hashes[0]), hashes
