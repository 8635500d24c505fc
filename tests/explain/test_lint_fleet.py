"""`lint --hosts`: every layer that can diverge names the hosts of the fleet it affects, each host's int8
path read from its worker's fingerprint (the saturating VPMADDUBSW path on AVX2 without VNNI; exact on
VNNI/AMX)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantbench.analysis.tiers import int8_path
from quantbench.explain.lint import fleet_note, lint_model
from setup_required import missing_setup


def _u8s8_matmul(w):
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.array(0.01, np.float32), "w_s"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
             numpy_helper.from_array(np.array(0.02, np.float32), "x_s"),
             numpy_helper.from_array(np.array(0, np.uint8), "x_zp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_zp"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w_dq"]),
             helper.make_node("MatMul", ["x_dq", "w_dq"], ["y"], name="fc")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, w.shape[0]])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[1]])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _saturating():
    w = np.zeros((4, 2), np.int8)
    w[0, 0], w[1, 0] = 120, 100    # one pair that saturates vpmaddubsw's int16 sum
    return _u8s8_matmul(w)


FLEET = [int8_path("haswell", "x86_64", ["avx", "avx2", "fma", "sse4_1"]),
         int8_path("skylake", "x86_64", ["avx2", "fma", "avx512f", "avx512bw"]),
         int8_path("cascadelake", "x86_64", ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"]),
         int8_path("alderlake", "x86_64", ["avx2", "fma", "avx_vnni"]),
         int8_path("nehalem", "x86_64", ["sse4_1", "sse4_2"]),
         int8_path("pi4", "aarch64", ["asimd"])]


def test_layers_name_the_saturating_hosts_of_the_fleet():
    [row] = lint_model(_saturating(), FLEET)
    assert row.tiers == ["x86-vpmaddubsw"] and row.fleet_hosts == ["haswell", "skylake"]
    assert row.reason.endswith("in this fleet: haswell, skylake affected")
    assert "fleet_hosts" not in row.row()   # the lint table's columns stay as they were
    note = fleet_note(FLEET, [row])
    assert note.startswith("int8 paths of the fleet: saturating VPMADDUBSW path: haswell (avx2 without")
    assert "skylake (avx512bw without avx512_vnni/avx_vnni/amx_int8" in note
    assert "NEON int16 pair path: pi4" in note and "exact: cascadelake (avx512_vnni" in note
    assert "alderlake (avx_vnni" in note and "nehalem (no avx2" in note
    assert note.endswith("1 of 1 int8 layer(s) can diverge; hosts affected: haswell, skylake")
    assert fleet_note(FLEET, [row]) == note   # same inputs, same words


def test_clean_layers_affect_no_host():
    [row] = lint_model(_u8s8_matmul(np.ones((4, 2), np.int8)), FLEET)
    assert row.tiers == [] and "fleet" not in row.reason
    assert fleet_note(FLEET, [row]).endswith("0 of 1 int8 layer(s) can diverge; hosts affected: none")


@pytest.mark.slow
def test_lint_command_reads_the_hosts_fingerprints(workdir, capsys):
    """Real workers: this machine and the emulated Haswell (saturating). This machine's int8 path is derived
    from the features its CPUID shows this process (the local worker's, a whole-process mask included): exact
    with VNNI/AMX, saturating on AVX2 or AVX-512 without VNNI, exact SSE below AVX2."""
    from quantbench.cli import main
    from quantbench.hosts import emulated as EM
    from quantbench.hosts.masked import here_features

    ok, msg = EM.ready("x86-avx2")
    if not ok:
        missing_setup(f"x86-avx2 not set up: {msg}")
    here = int8_path("x86", "x86_64", here_features())
    affected = sorted(h for h in ("x86", "x86-avx2") if h == "x86-avx2" or here.kind == "saturates")
    onnx.save(_saturating(), workdir / "m.onnx")
    assert main(["lint", str(workdir / "m.onnx"), "--tables", str(workdir / "t"), "--hosts", "x86,x86-avx2"]) == 0
    out = capsys.readouterr().out
    assert "fc: " in out and f"in this fleet: {', '.join(affected)} affected" in out
    table = out.splitlines()
    assert table[0].split()[-3:] == ["fleet", "hosts", "affected"]
    assert next(ln for ln in table if ln.startswith("fc ")).split()[-2:] == ["x86-vpmaddubsw", ",".join(affected)]
    assert "saturating VPMADDUBSW path: " in out and "x86-avx2 (avx2 without avx512_vnni/avx_vnni/amx_int8" in out
    assert (f"exact: x86 ({here.why}" if here.kind == "exact" else f"x86 ({here.why}") in out
    assert out.count(f"hosts affected: {', '.join(affected)}") == 1
    assert main(["lint", str(workdir / "m.onnx"), "--tables", str(workdir / "t"), "--hosts", "nosuch"]) == 2


def test_tiers_this_cpu_cannot_show_are_predicted_from_their_features(workdir):
    """Under a whole-process SSE4.2 mask (`hosts exec`), no AVX-512 tier can be shown: lint predicts their int8
    paths from the profiles' features and marks them predicted."""
    import subprocess
    import sys

    from setup_required import need_tier

    need_tier("x86-sse4")
    onnx.save(_saturating(), workdir / "m.onnx")
    r = subprocess.run([sys.executable, "-m", "quantbench", "hosts", "exec", "--no-progress", "x86-sse4", "--",
                        sys.executable, "-m", "quantbench", "lint", "m.onnx", "--tables", "t",
                        "--hosts", "x86,x86-avx512,x86-vnni"], capture_output=True, text=True, cwd=workdir, timeout=600)
    assert r.returncode == 0, r.stderr
    assert ("x86-avx512 (avx512bw without avx512_vnni/avx_vnni/amx_int8: VPMADDUBSW int16 pair sums saturate; "
            "PREDICTED from its features, not measured)") in r.stdout
    assert "exact: x86 (no avx2: SSE PMADDWD kernel, exact), x86-vnni (avx512_vnni: VPDPBUSD, exact; PREDICTED" in r.stdout
    assert r.stdout.split("hosts affected: ")[1].splitlines()[0] == "x86-avx512 (predicted)"
