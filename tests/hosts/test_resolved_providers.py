"""Resolved, not requested: the provider that ran each node is read back from the run itself (its profile),
stored with the results, and a requested provider that is not available or ran no node is a flagged
finding (the run goes on); require_providers makes it an error."""

import collections
import json

import onnx
import onnxruntime as ort
import pytest

from hosts_helpers import fixtures, matmul_model, variant
from quantbench.store import hostresults
from quantbench.runs.runner import RunFailed, run_hosts

XNNPACK = {"providers": ["XnnpackExecutionProvider", "CPUExecutionProvider"]}


def _rows(root):
    return hostresults.load_outputs(tables_root=root, columns=["providers", "placement"]).to_pylist()


def test_xnnpack_request_on_pip_onnxruntime_is_a_flagged_fallback(workdir):
    assert "XnnpackExecutionProvider" not in ort.get_available_providers()  # pip onnxruntime has none
    model = matmul_model(workdir / "m.onnx")
    s = run_hosts(["x86"], [variant(model)], fixtures(2), progress=False, tables_root=workdir / "t", jobs=1,
                  session=XNNPACK)
    h = s.hosts[0]
    assert not s.errors and h.ran == 2   # the run goes on
    assert h.provider_findings == [f"variant tiny/fp32: requested XnnpackExecutionProvider is not available in this "
                                   f"onnxruntime (available: {', '.join(ort.get_available_providers())})"]
    assert h.placements == {"tiny/fp32": {"CPUExecutionProvider": {"MatMul": 1, "Softmax": 1}}}
    rows = _rows(workdir / "t")
    assert len(rows) == 4 and all(r["providers"] == ["CPUExecutionProvider"] for r in rows)  # what ran, not asked
    assert {r["placement"] for r in rows} == {'{"CPUExecutionProvider":{"MatMul":1,"Softmax":1}}'}


def test_required_providers_make_the_fallback_an_error(workdir):
    model = matmul_model(workdir / "m.onnx")
    with pytest.raises(RunFailed, match="requested execution providers are required: XnnpackExecutionProvider is "
                                        "not available in this onnxruntime"):
        run_hosts(["x86"], [variant(model)], fixtures(2), progress=False, tables_root=workdir / "t", jobs=1,
                  session=XNNPACK, require_providers=True)
    assert hostresults.load_outputs(tables_root=workdir / "t").num_rows == 0


def test_an_available_provider_that_ran_no_node_is_a_finding(workdir):
    model = matmul_model(workdir / "m.onnx")
    s = run_hosts(["x86"], [variant(model)], fixtures(1), progress=False, tables_root=workdir / "t", jobs=1,
                  session={"providers": ["AzureExecutionProvider", "CPUExecutionProvider"]})
    assert s.hosts[0].provider_findings == ["variant tiny/fp32: requested AzureExecutionProvider took no nodes "
                                            "(nodes per provider: CPUExecutionProvider 2)"]
    with pytest.raises(RunFailed, match="AzureExecutionProvider took no nodes"):
        run_hosts(["x86"], [variant(model)], fixtures(1), progress=False, tables_root=workdir / "u", jobs=1,
                  session={"providers": ["AzureExecutionProvider", "CPUExecutionProvider"]}, require_providers=True)


def test_node_counts_per_provider_match_the_optimised_graph(workdir):
    """The demo classifier's placement counts every node of the graph onnxruntime ran (its optimised model,
    saved by onnxruntime itself, is the independent count)."""
    from quantbench.inputs.assets import demo_model
    from quantbench.inputs.fixtures import Fixture

    src = demo_model("litter-cnn")
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(workdir / "optimised.onnx")
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    want = dict(sorted(collections.Counter(n.op_type for n in onnx.load(workdir / "optimised.onnx").graph.node).items()))
    import numpy as np

    x = np.linspace(0, 1, 3 * 128 * 128, dtype=np.float32).reshape(1, 3, 128, 128)
    from quantbench.tensorcode import tensor_sha256

    fx = Fixture(fixture_id=tensor_sha256(x), input_name="images", array=x, source="ramp", image_sha256="")
    s = run_hosts(["x86"], [variant(src, model="litter-cnn")], [fx], progress=False, tables_root=workdir / "t", jobs=1)
    assert s.hosts[0].placements == {"litter-cnn/fp32": {"CPUExecutionProvider": want}} and not s.hosts[0].provider_findings
    assert json.loads(_rows(workdir / "t")[0]["placement"]) == {"CPUExecutionProvider": want}


def test_a_failed_job_leaves_no_profile_behind(workdir, monkeypatch):
    """A session whose profiled first run failed is dropped, its profiling ended: no profile file stays in the
    temporary folder of a worker that has no run folder (the explain commands' sessions)."""
    from hosts_helpers import gather_model
    from quantbench.errors import UserError
    from quantbench.hosts.registry import resolve_hosts
    from quantbench.hosts.workerclient import WorkerClient

    tmp = workdir / "systmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    model = gather_model(workdir / "g.onnx").read_bytes()
    with WorkerClient(resolve_hosts(["x86"])[0]) as hs:
        with pytest.raises(UserError, match="run error"):
            hs.run(model, fixtures(1, first_values=[9]))
        assert list(tmp.iterdir()) == []
        hs.run(model, fixtures(1, first_values=[1]))   # the next job profiles a new session
        assert hs.provider_problems == []
    # the worker has ended: whatever its sessions profiled was read and removed (checked only now: on one core
    # the worker may still be removing the last profile when the job's final frame has reached the client)
    assert list(tmp.iterdir()) == []
