"""A host carries its session: presets carry the real device's defaults, the hosts file sets providers and
session options per host, the command line overrides them for every host, a run plan holds one session per
host (in its run keys), and the scheduler counts a worker's threads against the cores it hands out."""

import json
import threading

import pytest

from hosts_helpers import fixtures, matmul_model, slow_model, variant
from quantbench.errors import UserError
from quantbench.hosts import emulated
from quantbench.hosts.deploy import deployed_session, describe, worker_threads
from quantbench.hosts.keys import session_key
from quantbench.hosts.registry import hosts_from_text, parse_hosts, resolve_hosts
from quantbench.runs.runner import _HostRun, plan_run, run_hosts
from quantbench.runs.scheduling import Scheduler


def _spec(name, hosts_file=None):
    return resolve_hosts([name], hosts_file)[0]


def test_presets_carry_the_devices_defaults():
    for name in ("pi", "pi4", "pi3", "graviton2", "graviton3"):
        s = deployed_session(_spec(name))
        assert s["intra_op_num_threads"] == 4 and s["providers"] == ["CPUExecutionProvider"], name
        assert emulated.PRESETS[name].device  # says what it models (e.g. c7g.xlarge: 4 vCPUs)
    for name in ("x86", "local", "x86-avx2", "x86-sse4"):
        assert deployed_session(_spec(name))["intra_op_num_threads"] == 1, name
    assert describe(deployed_session(_spec("pi"))) == "CPUExecutionProvider; 4 intra-op threads; graph opt all"


def test_hosts_file_sets_providers_and_options_and_the_command_line_overrides(workdir):
    hf = workdir / "quantbench.toml"
    hf.write_text('lab = { kind = "emulated", preset = "pi", intra_op_num_threads = 2, '
                  'providers = ["XnnpackExecutionProvider", "CPUExecutionProvider"] }\n'
                  'box = { kind = "local", graph_optimization_level = "basic" }\n')
    lab, box = _spec("lab", hf), _spec("box", hf)
    assert lab.options == {"preset": "pi"}  # session keys are not kind options
    s = deployed_session(lab)
    assert s["intra_op_num_threads"] == 2 and s["providers"] == ["XnnpackExecutionProvider", "CPUExecutionProvider"]
    assert deployed_session(box)["graph_optimization_level"] == "basic"
    over = deployed_session(lab, {"intra_op_num_threads": 1, "config_entries": {"a": "1"}})
    assert over["intra_op_num_threads"] == 1 and over["providers"] == s["providers"] and over["config_entries"] == {"a": "1"}
    # 0 (onnxruntime's default) is never sent: under qemu-user it would be this machine's cores
    assert deployed_session(lab, {"intra_op_num_threads": 0})["intra_op_num_threads"] == 2
    # the explain commands' items start from the host's own session too
    req = parse_hosts("lab,lab+providers=CPUExecutionProvider", hosts_file=hf)
    assert [r.session["providers"] for r in req] == [s["providers"], ["CPUExecutionProvider"]]
    assert req[0].session["intra_op_num_threads"] == 2


@pytest.mark.parametrize("entry,problem", [
    ('providers = "XnnpackExecutionProvider"', "providers must be a list of execution provider names"),
    ('intra_op_num_threads = 0', "intra_op_num_threads must be a whole number of threads, at least 1 (got 0)"),
    ('intra_op_num_threads = "4"', "intra_op_num_threads must be a whole number of threads"),
    ('execution_mode = "fast"', "execution_mode 'fast'; choose from sequential, parallel"),
])
def test_bad_session_keys_are_one_line_errors_naming_the_line(tmp_path, entry, problem):
    text = f'# hosts\nlab = {{ kind = "emulated", preset = "pi", {entry} }}\n'
    with pytest.raises(UserError) as err:
        hosts_from_text(tmp_path / "q.toml", text, tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'q.toml'}:2: host 'lab': ") and problem in msg and "\n" not in msg


def test_a_run_plan_holds_one_session_per_host_in_its_run_keys(workdir):
    model = matmul_model(workdir / "m.onnx")
    plan = plan_run(["x86", "pi"], [variant(model)], fixtures=fixtures(1), check_hosts=False)
    assert plan.sessions["x86"]["intra_op_num_threads"] == 1 and plan.sessions["pi"]["intra_op_num_threads"] == 4
    # the stored pi results (one thread) are not this run's: another session key, so recomputed, never mixed
    assert session_key(plan.sessions["pi"]) != session_key(None)
    again = plan_run(["x86", "pi"], [variant(model)], fixtures=fixtures(1), check_hosts=False,
                     session={"intra_op_num_threads": 1})
    assert again.sessions["pi"] == again.sessions["x86"] == deployed_session(_spec("x86"))


class _Run:
    """What the scheduler asks of a host run."""

    uses_local_slot = True

    def __init__(self, cores):
        self.cores, self.stop, self.lock, self.starting, self.granted = cores, threading.Event(), threading.Lock(), 0, 0

    def wants_worker(self):
        return not self.granted and not self.starting

    def work_left(self):
        return 1.0

    def grant(self):
        self.granted += 1


def test_the_scheduler_hands_a_worker_one_slot_per_thread():
    sched = Scheduler(2)
    four, one = _Run(2), _Run(1)   # a 4-thread worker on 2 cores takes both slots (min(threads, slots))
    assert sched.first_slot(four) and sched.free == 0
    sched.runs = [one]
    sched.rebalance()
    assert one.granted == 0        # no free core for it while the 4-thread worker runs
    sched.release(four)            # its slots go back: the waiting host gets one
    assert one.granted == 1 and sched.free == 1
    assert worker_threads({"intra_op_num_threads": 4}) == 4
    assert worker_threads({"intra_op_num_threads": 2, "inter_op_num_threads": 3, "execution_mode": "parallel"}) == 6


def test_a_many_thread_worker_runs_alone_on_the_slots(workdir, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_HOME", str(workdir / "home"))
    monkeypatch.setattr(_HostRun, "STARTUP_FACTOR", 0.0)
    slow = slow_model(workdir / "slow.onnx", layers=8)
    from quantbench.hosts.deploy import usable_cores

    cores = usable_cores()  # a session takes at most the cores (deploy.check_threads): here all of them
    s = run_hosts(["x86"], [variant(slow)], fixtures(12), progress=False, tables_root=workdir / "t", jobs=cores,
                  session={"intra_op_num_threads": cores})
    h = s.hosts[0]
    assert h.workers == 1 and h.ran == 12 and not s.errors   # as many threads as slots: no second worker
    assert h.session["intra_op_num_threads"] == cores and h.session_key == session_key(h.session)


def test_an_imported_host_runs_under_the_session_its_file_was_made_with(workdir, capsys):
    """An export of a 2-thread host merges as a whole: the imported host (no session keys of its own) takes the
    one session its file holds, not the default one."""
    from quantbench.cli import main
    from run_helpers import variants_folder
    from hosts_helpers import make_corpus, need_cores

    need_cores(2)
    vdir, labels = variants_folder(workdir / "v"), make_corpus(workdir / "corpus")
    common = ["--variants", str(vdir), "--fixtures", str(labels), "--split", "eval", "--no-progress"]
    (workdir / "hosts.toml").write_text('box = { kind = "local", intra_op_num_threads = 2 }\n'
                                        'airgap = { kind = "imported", file = "box.qbr" }\n')
    hf = ["--hosts-file", "hosts.toml"]
    assert main(["run", "--hosts", "box", "--tables", "a", "--export", "box.qbr", *hf, *common]) == 0
    capsys.readouterr()
    assert main(["run", "--hosts", "airgap", "--tables", "b", *hf, *common, "--json"]) == 0
    text = capsys.readouterr().out
    out = json.loads(text[text.index("{"):])["hosts"][0]   # (after the hosts file's line)
    assert out["imported"] > 0 and out["session"]["intra_op_num_threads"] == 2 and not out["notes"], out


def test_a_job_that_fails_leaves_the_worker_in_step(workdir):
    """A worker answers a failed job with an error frame and then its "done": the session reads both before it
    raises, so the next job on the same worker gets its own results (measured before: the stale "done" ended the
    next request at once with no results, and every later one read its predecessor's frames)."""
    from quantbench.explain.localize import open_worker
    from quantbench.hosts.workerclient import JobFailed

    good = matmul_model(workdir / "m.onnx").read_bytes()
    fxs = fixtures(2)
    w = open_worker(parse_hosts("x86")[0])
    try:
        before = [r["outputs"]["logits"]["sha256"] for r in w.run(good, fxs)]
        with pytest.raises(JobFailed):
            w.run(b"not a model", fxs)
        after = w.run(good, fxs)
        assert [r["fixture_id"] for r in after] == [fx.fixture_id for fx in fxs]
        assert [r["outputs"]["logits"]["sha256"] for r in after] == before
    finally:
        w.close()
