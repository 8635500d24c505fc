"""The runtime a host carries: a pinned pip onnxruntime version (NAME@VERSION, `onnxruntime =` in the hosts file)
on emulated and local hosts, Debian's onnxruntime in its own root (pi-xnnpack, pi-debian, x86-dnnl), and a
runtime that cannot start on a CPU recorded as that host's result."""

import json

import pytest

from hosts_helpers import fixtures, image_model, make_corpus, matmul_model, variant
from quantbench.store import partread
from quantbench.analysis.classes import version_findings, version_text
from quantbench.cli import main
from quantbench.errors import UserError
from quantbench.store import hostresults
from quantbench.hosts.keys import local_ort_version
from quantbench.hosts.registry import load_hosts_file, make_host, resolve_hosts
from quantbench.runs.runner import run_hosts
from setup_required import missing_setup

A72_SIGILL = "onnxruntime 1.21.0 does not start on Cortex-A72: SIGILL at import"


def _need(*names, hosts_file=None):
    for spec in resolve_hosts(list(names), hosts_file):
        ok, msg = make_host(spec).ready()
        if not ok:
            missing_setup(f"host {spec.name}: {msg}")


def _hosts_rows(root) -> dict:
    return {r["host"]: r for r in partread.read("hosts", root=root).to_pylist()}


def test_a_version_is_part_of_a_host_name_and_of_the_hosts_file(workdir):
    pinned, local, plain = resolve_hosts(["pi4@1.20.1", "x86@1.20.1", "pi4"])
    assert (pinned.name, pinned.kind, pinned.options) == ("pi4@1.20.1", "emulated",
                                                          {"preset": "pi4", "onnxruntime": "1.20.1"})
    assert (local.name, local.kind, local.options) == ("x86@1.20.1", "local", {"onnxruntime": "1.20.1"})
    assert plain.options == {"preset": "pi4"}
    (workdir / "hosts.toml").write_text('lab = { kind = "emulated", preset = "pi4", onnxruntime = "1.20.1" }\n'
                                        'dev = { kind = "local", runtime = "debian:trixie" }\n')
    specs = load_hosts_file(workdir / "hosts.toml")
    assert make_host(specs["lab"]).runtime.ort_version() == "1.20.1"
    assert make_host(specs["dev"]).runtime.describe() == "Debian trixie onnxruntime 1.21.0"
    assert make_host(resolve_hosts(["pi"])[0]).runtime.ort_version() == local_ort_version()


@pytest.mark.parametrize("name, message", [   # the library names the parameter; the command line, --hosts
    ("pi4@latest", "hosts 'pi4@latest': onnxruntime version 'latest' is not a version like 1.20.1"),
    ("pi-debian@1.20.1", "hosts 'pi-debian@1.20.1': runtime debian:trixie ships onnxruntime 1.21.0 only, not "
                         "1.20.1; use runtime \"pypi\" for another version"),
    ("nowhere@1.20.1", "hosts: unknown host 'nowhere'; known hosts:"),
])
def test_a_bad_version_in_a_host_name_is_one_line_error(workdir, name, message):
    with pytest.raises(UserError) as err:
        resolve_hosts([name])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_bad_runtime_in_the_hosts_file_names_the_line(workdir):
    (workdir / "h.toml").write_text('ok = { kind = "local" }\nlab = { kind = "emulated", preset = "pi4", '
                                    'runtime = "conda" }\nbox = { kind = "ssh", address = "ci@box" }\n')
    with pytest.raises(UserError, match=r"h\.toml:2: host 'lab': runtime 'conda'; choose from pypi, "
                                        r"debian:trixie \(onnxruntime 1\.21\.0\)$"):
        load_hosts_file(workdir / "h.toml")
    (workdir / "h.toml").write_text('box = { kind = "ssh", address = "ci@box" }\n')
    with pytest.raises(UserError, match=r"host 'box' runs its own onnxruntime \(kind ssh\); a version can be put "
                                        r"on local and emulated hosts only"):
        resolve_hosts(["box@1.20.1"], workdir / "h.toml")


@pytest.mark.parametrize("name, arch", [("pi4@1.99.0", "aarch64"), ("x86@1.99.0", "x86_64")])
def test_a_version_without_a_wheel_is_one_line_error_naming_the_versions(workdir, capsys, name, arch):
    """pip's own list of the versions that have a wheel for the architecture and Python; nothing is set up."""
    rc = main(["hosts", "setup", name, "--no-progress"])
    err = capsys.readouterr().err
    if "failed:" in err:
        missing_setup(f"pip cannot reach the package index: {err.strip()}")
    assert rc == 2 and err.count("\n") == 1, err
    assert f"onnxruntime 1.99.0: no wheel for {arch} CPython " in err and "; versions with one: " in err
    assert "1.20.1" in err.split("versions with one: ")[1]


def test_an_unknown_provider_is_one_line_error_naming_the_available_ones(workdir):
    with pytest.raises(UserError) as err:
        run_hosts(["x86"], [variant(matmul_model(workdir / "m.onnx"))], fixtures(1), progress=False,
                  tables_root=workdir / "t", session={"providers": ["XnnpakExecutionProvider"]})
    assert "unknown execution provider XnnpakExecutionProvider; this onnxruntime" in str(err.value)
    assert "CPUExecutionProvider" in str(err.value).split(" has ")[1] and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_version_runs_on_an_emulated_and_on_the_local_host(workdir):
    """pi4@1.20.1 (aarch64 cp311 wheels under qemu) and x86@1.20.1 (this interpreter with 1.20.1 first on its
    path) report the version they ran, a fingerprint field: their results are kept apart from x86's."""
    _need("pi4@1.20.1", "x86@1.20.1")
    root = workdir / "t"
    s = run_hosts(["pi4@1.20.1", "x86@1.20.1", "x86"], [variant(matmul_model(workdir / "m.onnx"))], fixtures(2),
                  progress=False, tables_root=root, jobs=2)
    assert [(h.ran, h.errors, h.notes) for h in s.hosts] == [(2, [], [])] * 3
    rows = _hosts_rows(root)
    assert {h: rows[h]["ort_version"] for h in rows} == {"pi4@1.20.1": "1.20.1", "x86@1.20.1": "1.20.1",
                                                         "x86": local_ort_version()}
    assert rows["x86@1.20.1"]["fingerprint_id"] != rows["x86"]["fingerprint_id"]
    assert rows["pi4@1.20.1"]["arch"] == "aarch64"


def test_version_findings_name_a_version_only_where_the_bytes_differ():
    same_cpu = {"arch": "aarch64", "cpu": "0x41 0xd08", "isa:asimd": True}
    feats = {"pi4": dict(same_cpu, ort_version="1.32.0"), "pi4@1.20.1": dict(same_cpu, ort_version="1.20.1"),
             "pi": dict(same_cpu, cpu="0x41 0xd0b", ort_version="1.32.0")}
    agree = version_findings(feats, {"pi4": "A", "pi4@1.20.1": "A", "pi": "B"})
    assert [version_text(f) for f in agree] == [
        "pi4 (onnxruntime 1.32.0) vs pi4@1.20.1 (1.20.1): no difference between versions"]
    differ = version_findings(feats, {"pi4": "A", "pi4@1.20.1": "B", "pi": "A"})
    assert [f["finding"] for f in differ] == ["separated by version"]  # pi differs in its CPU: no version pair


@pytest.mark.slow
def test_two_versions_on_one_emulated_cpu_are_compared(workdir, capsys):
    """equiv names pi4 vs pi4@1.20.1 per variant: "separated by version" exactly where they are two classes."""
    _need("pi4", "pi4@1.20.1")
    model = image_model(workdir / "i.onnx")
    assert main(["equiv", "--hosts", "pi4,pi4@1.20.1", "--variants", str(model), "--fixtures",
                 str(make_corpus(workdir / "corpus")), "--no-progress", "--results", str(workdir / "r"),
                 "--decode", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (v,) = out["variants"]
    finding = "no difference between versions" if len(v["classes"]) == 1 else "separated by version"
    assert [f["finding"] for f in v["versions"]] == [finding]
    text = (workdir / "r" / "report.md").read_text()
    assert f"pi4 (onnxruntime {local_ort_version()}) vs pi4@1.20.1 (1.20.1): {finding}" in text


@pytest.mark.slow
def test_debian_presets_run_their_own_onnxruntime_and_providers(workdir):
    """pi-debian (CPU provider), pi-xnnpack (XNNPACK then CPU) under qemu Cortex-A76, x86-dnnl (oneDNN then
    CPU) natively with the root's own loader: Debian trixie's onnxruntime 1.21 with its three providers."""
    _need("pi-debian", "pi-xnnpack", "x86-dnnl")
    root = workdir / "t"
    s = run_hosts(["pi-debian", "pi-xnnpack", "x86-dnnl"], [variant(matmul_model(workdir / "m.onnx"))],
                  fixtures(2), progress=False, tables_root=root, jobs=2)
    assert [(h.ran, h.errors) for h in s.hosts] == [(2, [])] * 3
    rows = _hosts_rows(root)
    for h in ("pi-debian", "pi-xnnpack", "x86-dnnl"):
        ident = json.loads(rows[h]["fingerprint"])["identity"]
        assert rows[h]["ort_version"] == "1.21" and " 3.13." in ident["python"]
        assert {"DnnlExecutionProvider", "XnnpackExecutionProvider", "CPUExecutionProvider"} <= set(
            ident["onnxruntime"]["available_providers"])
    assert rows["pi-xnnpack"]["resolved_providers"] == ["XnnpackExecutionProvider", "CPUExecutionProvider"]
    assert rows["x86-dnnl"]["resolved_providers"] == ["DnnlExecutionProvider", "CPUExecutionProvider"]
    assert rows["pi-debian"]["resolved_providers"] == ["CPUExecutionProvider"]
    provs = {r["host"]: r["providers"] for r in hostresults.load_outputs(tables_root=root, tensors=False).to_pylist()}
    assert provs["pi-xnnpack"][0] == "XnnpackExecutionProvider" and provs["x86-dnnl"][0] == "DnnlExecutionProvider"


@pytest.mark.slow
def test_debian_onnxruntime_does_not_start_on_a_cortex_a72(workdir, capsys):
    """Debian's 1.21.0 arm64 build dies of SIGILL at import on Cortex-A72 (a Pi 4): that host's result, recorded
    in the hosts table and named by run and equiv, while the other hosts run; set up at first use."""
    _need("pi-debian")  # its root; pi4's prefix over it is made at first use
    (workdir / "quantbench.toml").write_text(
        'pi4-debian = { kind = "emulated", preset = "pi4", runtime = "debian:trixie" }\n')
    root = workdir / "t"
    s = run_hosts(["pi4-debian", "x86"], [variant(matmul_model(workdir / "m.onnx"))], fixtures(1),
                  progress=False, tables_root=root, jobs=2)
    assert [(h.name, h.does_not_start, h.errors) for h in s.hosts] == [("pi4-debian", A72_SIGILL, []),
                                                                        ("x86", "", [])]
    assert s.hosts[1].ran == 1 and f"host pi4-debian: {A72_SIGILL}" in s.hosts[0].notes
    assert _hosts_rows(root)["pi4-debian"]["does_not_start"] == A72_SIGILL
    assert _hosts_rows(root)["x86"]["does_not_start"] is None
    corpus = make_corpus(workdir / "corpus")
    assert main(["run", "--hosts", "pi4-debian,x86", "--variants", str(image_model(workdir / "i.onnx")),
                 "--fixtures", str(corpus), "--no-progress", "--tables", str(workdir / "c"), "--json"]) == 0
    by_host = {h["host"]: h for h in json.loads(capsys.readouterr().out)["hosts"]}
    assert (by_host["pi4-debian"]["does_not_start"], by_host["x86"]["does_not_start"]) == (A72_SIGILL, None)
    assert main(["equiv", "--hosts", "x86,pi4-debian", "--variants", str(workdir / "i.onnx"), "--fixtures",
                 str(corpus), "--no-progress", "--results", str(workdir / "r"),
                 "--decode", "none"]) == 0
    out = capsys.readouterr().out
    assert f"pi4-debian: {A72_SIGILL}" in out
    assert f"- pi4-debian: {A72_SIGILL}" in (workdir / "r" / "report.md").read_text()


def test_a_variant_the_runtime_cannot_run_is_that_hosts_result(workdir, capsys):
    """Debian's 1.21 has no ConvInteger kernel for int8 weights (uint8 ones run): a dynamic-quantized convolution with
    int8 weights does not run on x86-dnnl. The run
    goes on (a note), and equiv leaves the host out of that variant's classes and names why."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _need("x86-dnnl")
    w = numpy_helper.from_array(np.random.RandomState(0).randn(4, 3, 3, 3).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["images", "w"], ["c"], pads=[1, 1, 1, 1]),
                           helper.make_node("ReduceMean", ["c"], ["logits"], axes=[2, 3], keepdims=0)], "conv",
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    fp32 = workdir / "fp32.onnx"
    fp32.write_bytes(model.SerializeToString())
    quantize_dynamic(str(fp32), str(workdir / "dynamic.onnx"), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["Conv"])
    assert main(["equiv", "--hosts", "x86,x86-dnnl", "--variants", str(fp32), str(workdir / "dynamic.onnx"),
                 "--fixtures", str(make_corpus(workdir / "corpus")), "--no-progress", "--results", str(workdir / "r"),
                 "--decode", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    classes = {v["variant"]: [c["hosts"] for c in v["classes"]] for v in out["variants"]}
    assert classes["dynamic"] == [["x86"]] and sorted(h for c in classes["fp32"] for h in c) == ["x86", "x86-dnnl"]
    why = out["cannot_run"]["x86-dnnl"]["dynamic"]
    assert why.startswith("NOT_IMPLEMENTED : Could not find an implementation for ConvInteger")
    assert f"- x86-dnnl cannot run dynamic: {why}" in (workdir / "r" / "report.md").read_text()



@pytest.mark.parametrize("hosts", ["x86@1.20.1,x86", "x86@1.20.1"])
def test_a_variant_the_reference_host_cannot_run_is_reported_and_the_others_compared(workdir, capsys, hosts):
    """onnxruntime 1.20.1 has no ConvInteger kernel for int8 weights: after `calibrate`, with x86@1.20.1 as the
    reference host, dynamic is reported as a variant it cannot run (as for any other host), fp32 and the static
    variants are compared as usual, and the exit code follows the gates (the tensor gate: 1 exactly where a
    comparison fails it), not an error before the analysis. Alone, the host leaves dynamic NOT RUN (a named gate
    then fails on it: it was never run)."""
    from calib_helpers import make_corpus as calib_corpus, tiny_model

    _need("x86@1.20.1")
    labels, _ = calib_corpus(workdir / "corpus", n_litter=12, n_negative=12, n_eval=4)
    assert main(["calibrate", "--model", str(tiny_model(workdir / "models" / "tiny.onnx")), "--labels",
                 str(labels), "--per-cell", "3", "--no-progress"]) == 0
    capsys.readouterr()
    argv = ["equiv", "--hosts", hosts, "--no-progress", "--decode", "none"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    why = out["cannot_run"]["x86@1.20.1"]["dynamic"]
    assert why.startswith("NOT_IMPLEMENTED : Could not find an implementation for ConvInteger")
    assert list(out["cannot_run"]) == ["x86@1.20.1"] and list(out["cannot_run"]["x86@1.20.1"]) == ["dynamic"]
    names = hosts.split(",")
    others = names[1:]
    classes = {v["variant"]: sorted(h for c in v["classes"] for h in c["hosts"]) for v in out["variants"]}
    assert classes == {"fp32": sorted(names), "dynamic": others, "static-minmax": sorted(names),
                       "static-percentile": sorted(names)}
    compared = {(c["variant"], c["host"], c["comparison"]) for c in out["comparisons"]}
    assert not {c for c in compared if c[0] == "dynamic" and (c[1] == "x86@1.20.1" or c[2] == "ref-same")}
    assert {("dynamic", h, k) for h in others for k in ("own-fp32", "ref-fp32")} <= compared
    assert ("static-minmax", "x86@1.20.1", "own-fp32") in compared
    report = (workdir / "results" / "report.md").read_text()
    assert f"- x86@1.20.1 cannot run dynamic: {why}" in report
    assert ("- **NOT RUN** dynamic: no host's runtime can run it (named under the classes); no gate checks it."
            in report) == (not others)
    failing = any(not c["tensor_gate"]["passed"] for c in out["comparisons"])
    never_run = not others   # dynamic ran nowhere: a gate cannot pass on it
    assert main([*argv, "--gate", "tensor"]) == (1 if failing or never_run else 0)
    assert "error" not in capsys.readouterr().err
