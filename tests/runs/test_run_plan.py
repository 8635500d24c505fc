"""A run is planned once (runs.runner.plan_run): before any host starts, each model file is parsed once,
whatever checks the command runs on it (decoder outputs, input recipe, identity, which fixtures fit), and not at
all when what the plan reads of it is remembered from an earlier command (modelio.model_facts)."""

import collections
from pathlib import Path

import onnx
import pytest

from calib_helpers import make_corpus, tiny_model
from hosts_helpers import fixtures, matmul_model, variant
from quantbench.cli import main
from quantbench.errors import ParameterError
from quantbench.runs import runner
from quantbench.runs.runner import plan_run, run_plan
from quantbench.hosts.workerclient import WorkerClient


def count_loads(monkeypatch, sessions: bool = False, home=None):
    """Every onnx.load in this process, by resolved path; and the counts when the hosts started (runner._run_all;
    `sessions`: each worker an explain command opens, workerclient.WorkerClient.open). `home`: a QUANTBENCH_HOME of
    its own, so no model's facts are remembered from elsewhere (default: the workdir's)."""
    monkeypatch.setenv("QUANTBENCH_HOME", str(home or Path.cwd() / "qb-home"))
    loads, at_start = collections.Counter(), []
    real_load, real_run_all, real_open = onnx.load, runner._run_all, WorkerClient.open

    def load(f, *a, **kw):
        loads[str(Path(f).resolve())] += 1
        return real_load(f, *a, **kw)

    def run_all(*a, **kw):
        at_start.append(dict(loads))
        return real_run_all(*a, **kw)

    def open_worker(self, *a, **kw):
        at_start.append(dict(loads))
        return real_open(self, *a, **kw)

    monkeypatch.setattr(onnx, "load", load)
    monkeypatch.setattr(runner, "_run_all", run_all)
    if sessions:
        monkeypatch.setattr(WorkerClient, "open", open_worker)
    return loads, at_start


@pytest.mark.parametrize("command", ["equiv", "run"])
def test_fresh_demo_run_parses_each_model_once_before_the_hosts_start(workdir, capsys, monkeypatch, command):
    loads, at_start = count_loads(monkeypatch)
    args = [command, "--hosts", "x86", "--limit", "2", "--no-progress"] + (["--no-plots"] if command == "equiv" else [])
    assert main(args) == 0, capsys.readouterr()
    assert len(at_start) == 1  # the hosts started once
    models = {p: n for p, n in at_start[0].items() if p.endswith(".onnx")}
    assert len(models) >= 2  # the demo's models (every variant is one file)
    assert models == {p: 1 for p in models}


def test_a_bare_model_file_is_parsed_once(workdir, capsys, monkeypatch):
    """A bare .onnx (no recipe) is parsed to tell a float model from a quantized one; the plan takes that parse."""
    labels, _ = make_corpus(workdir / "corpus", n_litter=6, n_negative=6, n_eval=2)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    loads, at_start = count_loads(monkeypatch)
    assert main(["equiv", "--hosts", "x86", "--variants", str(model), "--fixtures", str(labels), "--no-progress",
                 "--no-plots"]) == 0, capsys.readouterr()
    assert at_start and {Path(p).name: n for p, n in at_start[0].items() if p.endswith(".onnx")} == {"tiny.onnx": 1}


def test_a_second_run_parses_no_unchanged_model(workdir, capsys, monkeypatch):
    """What a plan reads of a model is remembered with the file's state: the next command parses none."""
    loads, at_start = count_loads(monkeypatch)
    args = ["run", "--hosts", "x86", "--limit", "2", "--no-progress"]
    assert main(args) == 0, capsys.readouterr()
    assert {p for p in loads if p.endswith(".onnx")}
    loads.clear()
    assert main(args) == 0, capsys.readouterr()
    assert [p for p in loads if p.endswith(".onnx")] == []


def test_model_facts_follow_the_file(workdir, monkeypatch):
    """A rewritten model (its ctime moves with any write) is parsed again, and its facts are its own; an external
    data file that changes makes the model's facts be worked out again too."""
    from quantbench.inputs.modelio import model_facts

    loads, _ = count_loads(monkeypatch)
    a = matmul_model(workdir / "a.onnx", k=4)
    first = model_facts(a)
    assert model_facts(a) == first and sum(loads.values()) == 1
    matmul_model(workdir / "a.onnx", k=5)   # another graph in the same file
    second = model_facts(a)
    assert sum(loads.values()) == 2 and second.semantic_sha256 != first.semantic_sha256
    assert second.raw_sha256 != first.raw_sha256
    m = onnx.load(str(a))
    onnx.save(m, str(workdir / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    ext = model_facts(workdir / "ext.onnx")
    assert ext.external_data and ext.semantic_sha256 == second.semantic_sha256   # the same model, data outside
    loads.clear()
    assert model_facts(workdir / "ext.onnx") == ext and not loads
    data = workdir / "ext.data"
    data.write_bytes(data.read_bytes())   # rewritten (same bytes): worked out again, the same facts
    assert model_facts(workdir / "ext.onnx") == ext and sum(loads.values()) == 1
    assert model_facts(workdir / "ext.onnx", fresh=True) == ext and sum(loads.values()) == 2


def test_latency_parses_each_model_once(workdir, capsys, monkeypatch):
    """An explain command that runs hosts plans its run too (latency: the timed fixture and the variant id)."""
    loads, _ = count_loads(monkeypatch)
    assert main(["latency", "--hosts", "local", "--runs", "10", "--repeats", "3", "--warmup", "1"]) == 0, \
        capsys.readouterr()
    models = {p: n for p, n in loads.items() if p.endswith(".onnx")}
    assert len(models) >= 2  # the demo's models
    assert models == {p: 1 for p in models}


TWO_HOSTS = "x86,x86+session.set_denormal_as_zero=1"
EXPLAIN = {
    "localize": ["--hosts", TWO_HOSTS],
    "noise": ["--hosts", "x86", "--limit", "2", "--factors", "repeat,threads", "--decode", "threshold-map"],
    "remedy": ["--hosts", TWO_HOSTS, "--limit", "2", "--remedies", "baseline,x64quantprecision",
               "--decode", "threshold-map"],
}


@pytest.mark.parametrize("command", sorted(EXPLAIN))
def test_an_explain_command_parses_its_model_once(workdir, capsys, monkeypatch, command):
    """localize, noise and remedy plan their run too (plan_run): the variant's file is parsed once, before any
    host starts, for its id, its fixtures, its decoder's outputs and its graph (remedy also checks the fp32
    reference it runs against its recipe: parsed once too)."""
    labels, _ = make_corpus(workdir / "corpus", n_litter=6, n_negative=6, n_eval=2)
    model = tiny_model(workdir / "models" / "tiny.onnx")
    assert main(["calibrate", "--model", str(model), "--labels", str(labels), "--per-cell", "2", "--no-pre-process",
                 "--methods", "minmax", "--no-progress"]) == 0, capsys.readouterr()
    loads, at_start = count_loads(monkeypatch, sessions=True)
    assert main([command, "--variant", "static-minmax", "--no-progress", *EXPLAIN[command]]) == 0, \
        capsys.readouterr()
    models = {Path(p).name: n for p, n in loads.items() if p.endswith(".onnx")}
    expected = {"static-minmax.onnx": 1, **({"fp32.onnx": 1} if command == "remedy" else {})}
    assert models == expected
    assert at_start and {Path(p).name: n for p, n in at_start[0].items() if p.endswith(".onnx")} == expected


def test_plan_knows_which_fixtures_fit_which_variant(workdir):
    a = matmul_model(workdir / "a.onnx")
    plan = plan_run(["x86"], [variant(a, name="fp32"), variant(a, name="again")], fixtures=fixtures(3),
                    command="run")
    assert [vi.name for vi in plan.variants] == ["fp32"]  # the same model is one variant
    assert [vi.name for _, vi in plan.asked] == ["fp32", "again"]
    vid = plan.variants[0].variant_id
    assert [fx.fixture_id for fx in plan.fixtures_for[vid]] == [fx.fixture_id for fx in fixtures(3)]
    assert plan.names == ["x86"] and plan.run_id and len(plan.hosts) == 1
    again = plan_run(["x86"], [variant(a, name="fp32"), variant(a, name="again")], fixtures=fixtures(3),
                     command="run")
    assert again.run_id == plan.run_id  # same inputs, same id
    summary = run_plan(plan, progress=False, tables_root=workdir / "t", jobs=1)
    assert summary.hosts[0].ran == 3 and not (workdir / "results").exists()


def test_plan_refuses_a_bad_limit_before_reading_anything(workdir, monkeypatch):
    loads, _ = count_loads(monkeypatch)
    with pytest.raises(ParameterError, match=r"^limit=0: must be at least 1"):
        plan_run(["x86"], [variant(matmul_model(workdir / "a.onnx"))], limit=0)
    assert not loads


def test_a_run_makes_each_host_object_once_and_asks_it_ready_once(workdir, capsys, monkeypatch):
    """The host object plan_run made is the one its workers start from (passed in, never made again)."""
    from quantbench.hosts.local import LocalHost

    seen = []
    real_ready, real_start = LocalHost.ready, LocalHost.start

    def ready(self):
        seen.append(("ready", id(self)))
        return real_ready(self)

    def start(self):
        seen.append(("start", id(self)))
        return real_start(self)

    monkeypatch.setattr(LocalHost, "ready", ready)
    monkeypatch.setattr(LocalHost, "start", start)
    model = matmul_model(workdir / "a.onnx")
    run_plan(plan_run(["x86"], [variant(model)], fixtures=fixtures(2)), progress=False, tables_root=workdir / "t",
             jobs=1)
    hosts = {h for _, h in seen}
    assert len(hosts) == 1 and sorted(k for k, _ in seen) == ["ready", "start"]
