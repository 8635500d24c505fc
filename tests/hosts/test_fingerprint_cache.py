"""The fingerprint cache: a rerun with nothing left to do starts no worker, the cache is keyed by what changes a
fingerprint (and can be turned off), and its keys keep their version-2 material."""

import os

import pytest

from hosts_helpers import count_starts, fixtures, matmul_model, variant
from quantbench.hosts import fingerprintcache
from quantbench.hosts.keys import normalize_session
from quantbench.hosts.registry import HostSpec, make_host
from quantbench.runs.runner import run_hosts
from quantbench.store import partread


def test_cached_rerun_starts_no_worker(workdir, home, monkeypatch):
    model = matmul_model(workdir / "m.onnx")
    root = workdir / "t"
    starts = count_starts(monkeypatch)
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
    starts = count_starts(monkeypatch)
    for _ in range(2):
        run_hosts(["x86"], [variant(model)], fixtures(2), progress=False, tables_root=workdir / "t", jobs=1)
    assert starts == ["x86", "x86"]


def _worker_code() -> str:
    """tensorcode.py's and the worker folder's sources in load order, each hashed, hashed together (what a worker
    runs)."""
    import hashlib
    from pathlib import Path

    from quantbench import worker as W

    h = hashlib.sha256()
    folder = Path(W.__file__).resolve().parent
    for p in (folder.parent / "tensorcode.py", *(folder / f"{m}.py" for m in ("protocol", "session", "fingerprint",
                                                                             "jobs"))):
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


@pytest.mark.slow  # the emulated hosts' readiness asks their qemu for its version
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
