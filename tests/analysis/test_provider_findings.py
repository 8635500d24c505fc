"""equiv flags a requested execution provider that fell back (pip onnxruntime has no XNNPACK: the request only
warns and runs the CPU provider) in the verdict, the classes table and the report, and goes on;
--require-providers makes it an error, with nothing analysed."""

import json
from pathlib import Path

from quantbench.store import partread
from quantbench.inputs.assets import DEMO_CLASSIFIER, demo_model
from quantbench.cli import main

ASK = ["--providers", "XnnpackExecutionProvider,CPUExecutionProvider"]


def _optimized_counts(model: Path) -> tuple[int, int]:
    """(nodes, Conv nodes) of the model as onnxruntime optimizes it on this CPU, one thread, ORT_ENABLE_ALL: the
    count follows the CPU (NCHWc blocking, and so the Reorder nodes, follows the vector width), so it is derived
    here, in this process, whose CPU (or CPUID mask) is the local host's."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.log_severity_level = 1, 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        ops = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    return len(ops), ops.count("Conv")


def test_fallback_is_flagged_in_verdict_classes_table_and_report(workdir, capsys):
    code = main(["equiv", "--hosts", "x86", *ASK, "--limit", "1", "--no-progress", "--no-plots"])
    out = capsys.readouterr().out
    assert code == 0, out
    flagged = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("- FLAGGED")]
    assert flagged and all(" on x86: requested XnnpackExecutionProvider is not available in this onnxruntime"
                           in ln for ln in flagged), out
    assert {ln.split(" on x86")[0] for ln in flagged} == {"- FLAGGED litter-cnn / fp32", "- FLAGGED litter-detr-tiny / fp32"}
    rows = partread.read("classes", root=Path("results/tables"), columns=["model", "provider_findings", "placements"]).to_pylist()
    assert rows and all(r["provider_findings"] and r["provider_findings"][0].startswith(
        "x86: requested XnnpackExecutionProvider is not available") for r in rows)
    assert all(set(json.loads(r["placements"])["x86"]) == {"CPUExecutionProvider"} for r in rows)
    report = Path("results/report.md").read_text()
    assert "x86 (provider fell back)" in report and "Execution providers (resolved, not requested)" in report
    nodes, convs = _optimized_counts(demo_model(DEMO_CLASSIFIER))
    assert (f"| litter-cnn | fp32 | x86 | XnnpackExecutionProvider, CPUExecutionProvider | CPUExecutionProvider "
            f"{nodes} nodes (Conv {convs},") in report
    assert "| CPUExecutionProvider; 1 intra-op thread; graph opt all |" not in report  # the host's session as asked
    assert "XnnpackExecutionProvider > CPUExecutionProvider; 1 intra-op thread; graph opt all" in report


def test_require_providers_refuses_the_fallback(workdir, capsys):
    code = main(["equiv", "--hosts", "x86", *ASK, "--require-providers", "--limit", "1", "--no-progress", "--no-plots"])
    err = capsys.readouterr().err
    assert code == 2
    assert "requested execution providers are required: XnnpackExecutionProvider is not available" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not Path("results/report.md").exists()
