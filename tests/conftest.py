"""Shared test fixtures.

Markers: `slow` (qemu emulation and other slow tests; `-m "not slow"` is the fast
subset), `ssh` (starts a real sshd on 127.0.0.1). The README's test command runs all.
"""

import os

import pytest


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run a test inside an empty working folder (results/, calib_sets/ land here)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Tests live in subfolders mirroring the package (tests/hosts/, tests/analysis/, ...) and import the shared helpers
# (tests/hosts_helpers.py, tests/ssh_helpers.py, ...) from anywhere: tests/ is on sys.path.
import sys as _sys
from pathlib import Path as _Path

_TESTS = str(_Path(__file__).resolve().parent)
if _TESTS not in _sys.path:
    _sys.path.insert(0, _TESTS)

# The helper modules that define fixtures, registered once as plugins: a fixture a test module imports is a new
# fixture of that module, so a session fixture imported into nine modules was built nine times per worker. Test
# modules use these fixtures by name and never import them (tests/test_architecture.py checks both).
pytest_plugins = ["cache_helpers", "fleet_helpers", "plugin_helpers", "release_helpers", "search_helpers",
                  "ssh_helpers", "tier_helpers"]

@pytest.fixture(autouse=True)
def no_plugin_consent():
    """Each test starts, like each command, with no plug-in allowed (quantbench.inputs.plugins keeps consent per process)."""
    from quantbench.inputs import plugins

    plugins.reset_consent()
    yield
    plugins.reset_consent()


# --- the fast subset stays fast: an unmarked test that starts qemu fails ------------------------------------------
# `-m "not slow"` is documented as the subset without emulation. A test that starts a qemu-user process (directly, or
# through the CLI, a worker or a cluster it spawns) must carry `@pytest.mark.slow`; this guard watches the test's own
# process tree while an unmarked test runs and fails the test when a qemu process appears in it. It only ever reports
# a process it saw, so it cannot fail a test that started none (a qemu process too short-lived to be seen costs
# nothing worth marking).


from qemu_watch import QemuWatch as _QemuWatch  # noqa: E402  (tests/ is on sys.path above)


def _watched(item):
    """The phase runs under a qemu watch unless the test is marked slow (or there is no /proc to watch)."""
    return item.get_closest_marker("slow") is None and os.path.isdir("/proc")


class _ClusterWatch:
    """Counts the Dask clusters (distributed's SpecCluster, LocalCluster's base) made in this process: the class is
    wrapped when distributed.deploy.spec is first imported, so a test that never imports it pays nothing."""

    made = 0

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "distributed.deploy.spec":
            return None
        import importlib.util

        _sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            _sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module, _run=run):
                _run(module)
                _ClusterWatch.counting(module.SpecCluster)

            spec.loader.exec_module = exec_module
        return spec

    @staticmethod
    def counting(cls) -> None:
        init = cls.__init__

        def __init__(self, *args, **kwargs):
            _ClusterWatch.made += 1
            init(self, *args, **kwargs)

        cls.__init__ = __init__


if "distributed.deploy.spec" in _sys.modules:
    _ClusterWatch.counting(_sys.modules["distributed.deploy.spec"].SpecCluster)
else:
    _sys.meta_path.insert(0, _ClusterWatch())


def _fail_if_emulating(item, watch, clusters_before: int) -> None:
    started = watch.seen[0] if watch.seen else \
        "a Dask cluster" if _ClusterWatch.made > clusters_before else None
    if started:
        pytest.fail(f"{item.nodeid} started {started} but is not marked slow: emulation and clusters belong in the "
                    f"slow set (@pytest.mark.slow), the fast subset (-m 'not slow') runs none", pytrace=False)


def _watched_phase(item):
    """A phase (setup or call) of an unmarked test, run under a qemu and cluster watch."""
    if not _watched(item):
        return (yield)
    clusters = _ClusterWatch.made
    with _QemuWatch() as watch:
        result = yield
    _fail_if_emulating(item, watch, clusters)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _watched_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _watched_phase(item))


# --- two workers (pytest-xdist, `-n 2 --dist loadgroup`): what measures the machine or fights for it runs on one -----
# Tests that start qemu, a cluster or an sshd (marked slow or ssh) and tests that count this machine's cores take
# one xdist group, so one worker runs them one after another while the other runs the light body. The acceptance
# suite (tests/acceptance/: real models end to end, a third of that group's time) takes a group of its own: it counts
# no cores and asserts no timing, so the other worker runs it beside the machine group and then takes its share of
# the light body. An acceptance module that counts the cores stays in the machine group. Without xdist the marks do
# nothing. A core-counting module is one whose source asks for the cores (CORE_COUNTING names).

#: what a test asks to count the cores this process may use
CORE_COUNTING = ("usable_cores", "need_cores", "cpu_count", "sched_getaffinity")
MACHINE_GROUP = "machine"
ACCEPTANCE_GROUP = "acceptance"
_ACCEPTANCE = _Path(_TESTS) / "acceptance"
_counts_cores: dict = {}


def _module_counts_cores(path) -> bool:
    if path not in _counts_cores:
        try:
            text = _Path(path).read_text()
        except OSError:
            text = ""
        _counts_cores[path] = any(word in text for word in CORE_COUNTING)
    return _counts_cores[path]


def machine_bound(item) -> bool:
    """Whether a test measures or loads the whole machine: emulation, clusters, sshd, or a count of its cores."""
    marked = any(item.get_closest_marker(m) is not None for m in ("slow", "ssh"))
    return marked or _module_counts_cores(str(item.path))


def machine_group(item) -> str | None:
    """The xdist group of a test that loads the machine (None for a light one): the acceptance suite's own unless
    its module counts the cores, else the machine group."""
    if not machine_bound(item):
        return None
    if _ACCEPTANCE in _Path(item.path).parents and not _module_counts_cores(str(item.path)):
        return ACCEPTANCE_GROUP
    return MACHINE_GROUP


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = machine_group(item)
        if group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)  # before xdist's hook sends the node ids to the controller
def pytest_collection_finish(session):
    """`--dist loadgroup` sends a test to its group's worker by the `@GROUP` suffix of its node id, which xdist 3.8
    writes to `item._nodeid`; pytest 9.2 keeps the id in `item._id`, so there the suffix never showed and every group
    was spread over both workers. The suffix is written where the running pytest reads it."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    from _pytest.nodeid import coerce_node_id

    for item in session.items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = coerce_node_id(item.nodeid + suffix)
